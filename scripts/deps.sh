#!/usr/bin/env bash
# Install what sbod's build, tests, demo and benchmarks need on a fresh Debian machine:
# a Rust toolchain (rustup, if cargo is missing), the real NBD clients and servers the tests
# drive, and iproute2 for the tests across network namespaces.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have fio || need_pkgs+=(fio)
have nbdinfo || need_pkgs+=(libnbd-bin)
have qemu-img || need_pkgs+=(qemu-utils)
have iscsi-test-cu || need_pkgs+=(libiscsi-bin)   # iscsi-inq, iscsi-ls, iscsi-test-cu, iscsi-perf: the iSCSI target's tests
ls /usr/lib/*/qemu/block-iscsi.so >/dev/null 2>&1 || need_pkgs+=(qemu-block-extra)  # qemu-img over iscsi://
have tgtd || need_pkgs+=(tgt)             # bench/bench-iscsi.sh: the peer target
have nbdkit || need_pkgs+=(nbdkit)   # also its file plugin, delay and error filters (remote members, a member failing by I/O errors)
[ -e /usr/include/nbdkit-plugin.h ] || need_pkgs+=(nbdkit-plugin-dev)  # bench/slowflush.c (bench-sync.sh --flush-delay)
have ceph-mon || need_pkgs+=(ceph-mon)   # a single-node Ceph (scripts/ceph-single-node.sh): the Ceph test, scripts/bench-ceph.sh
have ceph-mgr || need_pkgs+=(ceph-mgr)
have ceph-osd || need_pkgs+=(ceph-osd)
have rbd || need_pkgs+=(ceph-common)     # ceph, rbd; librbd1 for fio's rbd engine and qemu-img's rbd:
have ip || need_pkgs+=(iproute2)       # network namespaces for the remote-member tests
have openssl || need_pkgs+=(openssl)   # test certificates for NBD over TLS
[ -e /usr/include/isa-l.h ] || need_pkgs+=(libisal-dev)
python3 -c 'import nbd' 2>/dev/null || /usr/bin/python3 -c 'import nbd' 2>/dev/null || need_pkgs+=(python3-libnbd)
have cc || need_pkgs+=(build-essential)
have curl || need_pkgs+=(curl)
have smartctl || [ -x /usr/sbin/smartctl ] || need_pkgs+=(smartmontools)   # disk health (sbod health, the health tests)
have chromium || need_pkgs+=(chromium)   # the dashboard's test in a real headless browser
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || need_pkgs+=(python3-prometheus-client)  # Prometheus' text parser for /metrics

if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "deps: installing ${need_pkgs[*]}" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

if ! have cargo; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "deps: installing Rust with rustup" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy >&2
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

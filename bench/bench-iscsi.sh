#!/usr/bin/env bash
# Side-by-side iSCSI benchmark: sbod's target (`sbod serve --iscsi`, a raid0 of one member on
# tmpfs) and tgt (Debian's userspace target, tgtd, a file of the same size on the same
# tmpfs, rdwr backing store), both on loopback, driven by the same libiscsi-based loads in
# one run: iscsi-perf (reads; random 4K at queue depth 32 and 1, sequential 1M at depth 8)
# and qemu-img bench over qemu's libiscsi driver (writes; sequential 4K at depth 32, 1M at
# depth 8). Prints IOPS, MB/s, mean latency (queue depth / IOPS) and sbod/tgt.
#
#   bench/bench-iscsi.sh [--runtime SECONDS] [--size SIZE] [--repeat N]
#
# Defaults: 5 s per read job, 1G volume, 1 repetition. Write jobs are a fixed count sized to
# about the same time. The targets alternate which goes first in every repetition. Needs
# root for nothing; tgtd is started and stopped by the script on its own control port.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=5
SIZE=1G
REPEAT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
cargo build --release -q -p sbod
SBOD=$PWD/target/release/sbod

WORK=$(mktemp -d /dev/shm/sbod-bench-iscsi.XXXXXX)
export SBOD_STATE_DIR=$WORK/state
PIDS=()
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SPORT=$(free_port)
TPORT=$(free_port)
CPORT=$(( (RANDOM % 900) + 100 ))
cleanup() {
  tgtadm -C "$CPORT" --op update --mode sys --name State -v offline >/dev/null 2>&1 || true
  tgtadm -C "$CPORT" --op delete --mode system >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
    # tgtd may not end on SIGTERM while it has targets: give it a moment, then insist.
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

$SBOD create bench --level raid0 --size-each "$SIZE" "$WORK/m0.img" >/dev/null
EXPORT_BYTES=$($SBOD status bench --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
truncate -s "$EXPORT_BYTES" "$WORK/plain.img"
# Both written once, so neither reads holes.
dd if=/dev/zero of="$WORK/plain.img" bs=1M count=$((EXPORT_BYTES >> 20)) conv=notrunc status=none

$SBOD serve bench --nbd "unix:$WORK/nbd.sock" --iscsi "127.0.0.1:$SPORT" 2>"$WORK/sbod.log" &
PIDS+=($!)
SIQN=iqn.2025-01.io.sbod:bench
TIQN=iqn.2025-01.io.sbod:tgt-bench
tgtd -f -C "$CPORT" --iscsi "portal=127.0.0.1:$TPORT" >"$WORK/tgtd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do tgtadm -C "$CPORT" --op show --mode sys >/dev/null 2>&1 && break; sleep 0.1; done
tgtadm -C "$CPORT" --lld iscsi --op new --mode target --tid 1 -T "$TIQN"
tgtadm -C "$CPORT" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$WORK/plain.img" --bstype rdwr
tgtadm -C "$CPORT" --lld iscsi --op bind --mode target --tid 1 -I ALL
SURL="iscsi://127.0.0.1:$SPORT/$SIQN/0"
TURL="iscsi://127.0.0.1:$TPORT/$TIQN/1"
for _ in $(seq 100); do iscsi-inq "$SURL" >/dev/null 2>&1 && break; sleep 0.1; done
# sbod writes the volume once too (over NBD, fast).
qemu-img convert -n -O raw "$WORK/plain.img" "nbd+unix:///?socket=$WORK/nbd.sock"
iscsi-inq "$TURL" >/dev/null

opts() { # URL -> qemu image opts
  local u=${1#iscsi://}; local portal=${u%%/*}; local rest=${u#*/}
  echo "driver=iscsi,transport=tcp,portal=$portal,target=${rest%/*},lun=${rest##*/}"
}
# Each job prints "IOPS MBPS".
perf() { # URL depth blocks random?
  local r=; [ "$4" = 1 ] && r=-r
  # iscsi-perf rewrites its line with \r; the last "iops average" is the run's.
  iscsi-perf -m "$2" -b "$3" $r -t "$RUNTIME" "$1" 2>&1 | tr '\r' '\n' \
    | grep -o 'iops average [0-9]*' | tail -1 | awk -v bs=$(( $3 * 512 )) '{printf "%d %.1f\n", $3, $3*bs/1e6}'
}
bench_w() { # URL depth size count
  local t; t=$(qemu-img bench -w -t none -d "$2" -s "$3" -c "$4" --image-opts "$(opts "$1")" 2>&1 \
    | grep -o 'completed in [0-9.]*' | awk '{print $3}')
  python3 -c "import sys; c=$4; t=$t; s=int('$3'.rstrip('k'))*(1024 if '$3'.endswith('k') else 1); print('%d %.1f' % (c/t, c*s/t/1e6))"
}
JOBS=(
  "randread-4K-qd32:perf 32 8 1"
  "randread-4K-qd1:perf 1 8 1"
  "seqread-1M-qd8:perf 8 2048 0"
  "seqwrite-4K-qd32:bench_w 32 4k 150000"
  "seqwrite-1M-qd8:bench_w 8 1024k 3000"
)
RES=$WORK/res.txt
for rep in $(seq "$REPEAT"); do
  for job in "${JOBS[@]}"; do
    name=${job%%:*}; cmd=${job#*:}; fn=${cmd%% *}; args=${cmd#* }
    order="sbod tgt"; [ $((rep % 2)) = 0 ] && order="tgt sbod"
    for target in $order; do
      url=$SURL; [ "$target" = tgt ] && url=$TURL
      # shellcheck disable=SC2086
      out=$($fn "$url" $args)
      echo "$name $target $out" >>"$RES"
    done
  done
done
python3 - "$RES" <<'PY'
import sys, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
order = []
for l in open(sys.argv[1]):
    name, tgt, iops, mbps = l.split()
    if name not in order: order.append(name)
    rows[name][tgt].append((float(iops), float(mbps)))
def mean(v): return sum(v) / len(v)
depth = lambda n: int(n.split('qd')[1])
print("| job | sbod IOPS | tgt IOPS | sbod MB/s | tgt MB/s | sbod lat us | tgt lat us | sbod/tgt |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for n in order:
    s = [mean([x[i] for x in rows[n]['sbod']]) for i in (0, 1)]
    t = [mean([x[i] for x in rows[n]['tgt']]) for i in (0, 1)]
    d = depth(n)
    print(f"| {n} | {s[0]:,.0f} | {t[0]:,.0f} | {s[1]:,.1f} | {t[1]:,.1f} | {d*1e6/s[0]:,.0f} | {d*1e6/t[0]:,.0f} | {s[0]/t[0]:.2f} |")
PY

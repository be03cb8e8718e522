#!/usr/bin/env bash
# Member queue benchmark: worker threads (FileDev) vs io_uring (UringDev), side by side in
# one run, on a file in tmpfs (/dev/shm) and on the root file system (the repo's disk).
# Random 4K read/write at QD32, sequential 1M read/write at QD8; IOPS, MB/s, COV over the
# repetitions, CPU time per I/O and the uring/threads ratios. See docs/PERFORMANCE.md.
#
#   scripts/bench-members.sh                 # defaults: 1 GiB files, 3 x 2 s per backend
#   scripts/bench-members.sh --loop          # also a loop device (root only; on /dev/shm)
#   scripts/bench-members.sh -- --secs 5 --reps 5 --only randread
#
# Extra arguments after `--` go to the benchmark (see crates/sbod-core/examples/member_bench.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

loop=0
while [ $# -gt 0 ]; do
  case "$1" in
    --loop) loop=1; shift ;;
    --) shift; break ;;
    *) echo "usage: $0 [--loop] [-- benchmark arguments]" >&2; exit 2 ;;
  esac
done

cargo build --release -p sbod-core --example member_bench >&2
bin="${CARGO_TARGET_DIR:-target}/release/examples/member_bench"

targets=(--dir /dev/shm --dir "$PWD")
cleanup() { :; }
if [ "$loop" = 1 ]; then
  img=$(mktemp /dev/shm/sbod-bench-loop.XXXXXX)
  truncate -s 1G "$img"
  dev=$(losetup --direct-io=on -f --show "$img")
  cleanup() { losetup -d "$dev" 2>/dev/null || true; rm -f "$img"; }
  targets+=(--dev "$dev")
fi
trap cleanup EXIT

echo "# $(uname -sr), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" "${targets[@]}" --size 1G --secs 2 --reps 3 "$@"

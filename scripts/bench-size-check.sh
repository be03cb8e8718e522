#!/usr/bin/env bash
# What it costs to check a member file's size after every write (docs/PERFORMANCE.md,
# "Member size check"). The engine asks a member file its size (fstat) after each write
# to it, so that a file truncated under the array is failed before a write that grew it
# back with a hole is acknowledged. This script builds sbod twice from the working tree,
# as it ships and without that check (feature sbod-core/bench-no-size-check, which exists
# for this script only), and has both serve the same arrays in turn to the same fio job:
# 4 KiB random writes, queue depth 32, fio's nbd engine over a Unix socket. Arrays: raid0
# of one member and raid5 of three, members preallocated; on tmpfs (members in memory,
# done inline: where a syscall weighs most) and on the disk under target/ (O_DIRECT).
# ROUNDS rounds, the two builds taking turns; prints per case the median IOPS of each
# build and checked/unchecked.
#
#   scripts/bench-size-check.sh [--runtime SECONDS] [--rounds N] [--size SIZE] [--places tmpfs,disk]
#
# Defaults: 10 s per run, 3 rounds, 256M members, both places. On a shared machine single
# runs move by 10-20%; the medians of many short rounds, builds taking turns, are what to
# read (docs/PERFORMANCE.md). Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=10
ROUNDS=3
SIZE=256M
PLACES=tmpfs,disk
while [ $# -gt 0 ]; do
  case "$1" in
    --places) PLACES=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    *) echo "bench-size-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
BIN=$TARGET/bench-size-check
mkdir -p "$BIN"
cargo build --release -q -p sbod --features sbod-core/bench-no-size-check
cp "$TARGET/release/sbod" "$BIN/sbod-unchecked"
cargo build --release -q -p sbod
cp "$TARGET/release/sbod" "$BIN/sbod-checked"

SHM=$(mktemp -d /dev/shm/sbod-sizecheck.XXXXXX)
DISK=$(mktemp -d "$BIN/disk.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$SHM" "$DISK"
}
trap cleanup EXIT

# run BUILD PLACE LAYOUT -> prints write IOPS
run() {
  local build=$1 place=$2 layout=$3 dir n level
  dir=$(mktemp -d "$place/run.XXXXXX")
  case "$layout" in
    raid0x1) n=1; level=raid0 ;;
    raid5x3) n=3; level=raid5 ;;
  esac
  local members=()
  for i in $(seq 0 $((n - 1))); do members+=("$dir/m$i.img"); done
  export SBOD_STATE_DIR=$dir/state
  local sbod=$BIN/sbod-$build
  "$sbod" create b --level "$level" --size-each "$SIZE" --preallocate "${members[@]}" >/dev/null 2>&1
  "$sbod" serve b --nbd "unix:$dir/s.sock" 2>"$dir/serve.log" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 100); do nbdinfo --size "nbd+unix:///?socket=$dir/s.sock" >/dev/null 2>&1 && break; sleep 0.1; done
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$dir/s.sock" --rw=randwrite --bs=4k \
    --iodepth=32 --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json \
    --output="$dir/fio.json" >/dev/null 2>&1
  "$sbod" stop b >/dev/null
  wait "$pid" 2>/dev/null || true
  python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$dir/fio.json"
  rm -rf "$dir"
}

RESULTS=$BIN/results.txt
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
  for pname in ${PLACES//,/ }; do
    case "$pname" in
      tmpfs) place=$SHM ;;
      disk) place=$DISK ;;
      *) echo "bench-size-check: unknown place $pname" >&2; exit 2 ;;
    esac
    for layout in raid0x1 raid5x3; do
      # Alternate which build goes first, round by round.
      if [ $((round % 2)) -eq 1 ]; then order="checked unchecked"; else order="unchecked checked"; fi
      for build in $order; do
        iops=$(run "$build" "$place" "$layout")
        echo "$pname $layout $build $iops" | tee -a "$RESULTS" >&2
      done
    done
  done
done

python3 - "$RESULTS" "$ROUNDS" "$RUNTIME" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    place, layout, build, iops = line.split()
    rows.setdefault((place, layout), {}).setdefault(build, []).append(int(iops))
print(f"4K random writes, qd32, {sys.argv[2]} rounds of {sys.argv[3]} s, median IOPS")
print(f"{'members on':10} {'layout':8} {'checked':>10} {'unchecked':>10} {'checked/unchecked':>18} {'range of round ratios':>22}")
for (place, layout), b in rows.items():
    c, u = statistics.median(b["checked"]), statistics.median(b["unchecked"])
    r = sorted(x / y for x, y in zip(b["checked"], b["unchecked"]))
    print(f"{place:10} {layout:8} {c:>10.0f} {u:>10.0f} {c / u:>18.3f} {r[0]:>10.3f} - {r[-1]:.3f}")
EOF

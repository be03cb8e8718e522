#!/usr/bin/env bash
# What checksums on every block cost (docs/PERFORMANCE.md, "Checksums"): the same sbod
# build serves the same layouts created with --integrity crc32c and with --integrity none,
# in turn, to the lab's workloads through fio's nbd engine over a Unix socket: 4 KiB
# random read and write at queue depth 32, 1 MiB sequential read and write at queue depth
# 16. Members are preallocated files on the disk under target/ (O_DIRECT), written whole
# first (so reads verify real checksums, not blocks never written). ROUNDS rounds, the two
# settings taking turns; prints per case the median of each and crc32c/none. Also runs
# the crc32c micro benchmark (crates/sbod-core/examples/crc_bench.rs).
#
#   scripts/bench-integrity.sh [--runtime SECONDS] [--rounds N] [--size SIZE] [--layouts raid5x3,raid1x2,raid0x2]
#
# Defaults: 10 s per run, 3 rounds, 256M members, raid5 of 3 and raid1 of 2. On a shared
# machine single runs move by 10-20%; read the medians of rounds taken in turn. Not part
# of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=10
ROUNDS=3
SIZE=256M
LAYOUTS=raid5x3,raid1x2
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --layouts) LAYOUTS=$2; shift 2 ;;
    *) echo "bench-integrity: unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p sbod
cargo build --release -q -p sbod-core --example crc_bench
SBOD=$TARGET/release/sbod
"$TARGET/release/examples/crc_bench"

WORK=$(mktemp -d "$TARGET/bench-integrity.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

fio_run() { # uri name rw bs qd -> IOPS or MB/s
  local uri=$1 name=$2 rw=$3 bs=$4 qd=$5 out=$WORK/$2.json
  fio --name="$name" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$out" >/dev/null 2>&1
  python3 - "$out" "$rw" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["read"] if "read" in sys.argv[2] else j["write"]
print(round(side["iops"]) if "rand" in sys.argv[2] else round(side["bw_bytes"] / 1e6))
PY
}

# run INTEGRITY LAYOUT -> prints "workload value" lines
run() {
  local integ=$1 layout=$2 dir n level
  dir=$(mktemp -d "$WORK/run.XXXXXX")
  n=${layout##*x}
  level=${layout%x*}
  local members=()
  for i in $(seq 0 $((n - 1))); do members+=("$dir/m$i.img"); done
  export SBOD_STATE_DIR=$dir/state
  "$SBOD" create b --level "$level" --size-each "$SIZE" --preallocate --integrity "$integ" "${members[@]}" >/dev/null 2>&1
  "$SBOD" serve b --nbd "unix:$dir/s.sock" 2>"$dir/serve.log" &
  local pid=$!
  PIDS+=("$pid")
  local uri="nbd+unix:///?socket=$dir/s.sock"
  for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.1; done
  # Precondition: every block written once.
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 >/dev/null 2>&1
  echo "randread-4k $(fio_run "$uri" rr randread 4k 32)"
  echo "randwrite-4k $(fio_run "$uri" rw randwrite 4k 32)"
  echo "seqread-1m $(fio_run "$uri" sr read 1M 16)"
  echo "seqwrite-1m $(fio_run "$uri" sw write 1M 16)"
  "$SBOD" stop b >/dev/null
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

RESULTS=$WORK/results.txt
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
  for layout in ${LAYOUTS//,/ }; do
    if [ $((round % 2)) -eq 1 ]; then order="crc32c none"; else order="none crc32c"; fi
    for integ in $order; do
      run "$integ" "$layout" | while read -r w v; do
        echo "$layout $w $integ $v" | tee -a "$RESULTS" >&2
      done
    done
  done
done

python3 - "$RESULTS" "$ROUNDS" "$RUNTIME" "$SIZE" <<'EOF2'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    layout, w, integ, v = line.split()
    rows.setdefault((layout, w), {}).setdefault(integ, []).append(int(v))
print(f"members: preallocated files on disk, {sys.argv[4]} each; {sys.argv[2]} rounds of {sys.argv[3]} s; median (IOPS for 4k, MB/s for 1m)")
print(f"| layout | workload | none | crc32c | crc32c/none | range of round ratios |")
print(f"|---|---|---:|---:|---:|---|")
for (layout, w), b in rows.items():
    c, n = statistics.median(b["crc32c"]), statistics.median(b["none"])
    r = sorted(x / y for x, y in zip(b["crc32c"], b["none"]) if y)
    print(f"| {layout} | {w} | {n:.0f} | {c:.0f} | {c / n:.3f} | {r[0]:.3f} - {r[-1]:.3f} |")
EOF2

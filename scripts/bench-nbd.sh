#!/usr/bin/env bash
# Side-by-side NBD benchmark: sbod serving a raid0 of one member on tmpfs, and nbdkit's file
# plugin serving a file of the same size on the same tmpfs, driven by the same fio jobs
# (fio's nbd engine over a Unix socket) in one run. Prints IOPS, MB/s and sbod/nbdkit.
#
#   scripts/bench-nbd.sh [--runtime SECONDS] [--size SIZE] [--repeat N] [--jobs LIST]
#
# Defaults: 10 s per job, 1G export, 1 repetition, every job. --jobs takes a comma-separated
# list of job names (seqwrite-1M, randread-4K-qd32, randwrite-4K-qd32, seqread-1M,
# randread-4K-qd1, randwrite-4K-qd1). The two targets alternate within every repetition;
# "lat" is fio's mean completion latency (lat_ns). Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=10
SIZE=1G
REPEAT=1
ONLY=
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --jobs) ONLY=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
cargo build --release -q -p sbod
SBOD=$PWD/target/release/sbod

WORK=$(mktemp -d /dev/shm/sbod-bench.XXXXXX)
export SBOD_STATE_DIR=$WORK/state
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

$SBOD create bench --level raid0 --size-each "$SIZE" "$WORK/m0.img" >/dev/null
# nbdkit gets a file with exactly the export size sbod presents.
EXPORT_BYTES=$($SBOD status bench --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
truncate -s "$EXPORT_BYTES" "$WORK/plain.img"

$SBOD serve bench --nbd "unix:$WORK/sbod.sock" 2>"$WORK/sbod.log" &
PIDS+=($!)
nbdkit --foreground --exit-with-parent --unix "$WORK/nbdkit.sock" file "$WORK/plain.img" 2>"$WORK/nbdkit.log" &
PIDS+=($!)
for s in sbod nbdkit; do
  for _ in $(seq 100); do nbdinfo --size "nbd+unix:///?socket=$WORK/$s.sock" >/dev/null 2>&1 && break; sleep 0.1; done
done

JOBS=(
  "seqwrite-1M:--rw=write --bs=1M --iodepth=8"
  "randread-4K-qd32:--rw=randread --bs=4k --iodepth=32"
  "randwrite-4K-qd32:--rw=randwrite --bs=4k --iodepth=32"
  "seqread-1M:--rw=read --bs=1M --iodepth=8"
  "randread-4K-qd1:--rw=randread --bs=4k --iodepth=1"
  "randwrite-4K-qd1:--rw=randwrite --bs=4k --iodepth=1"
)
RESULTS=$WORK/results.jsonl
for rep in $(seq "$REPEAT"); do
  for job in "${JOBS[@]}"; do
    name=${job%%:*}; opts=${job#*:}
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    # Alternate which target goes first, so neither always runs on a warmer machine.
    order="sbod nbdkit"; [ $((rep % 2)) = 0 ] && order="nbdkit sbod"
    for target in $order; do
      # shellcheck disable=SC2086
      fio --name="$name" --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/$target.sock" $opts \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --size="$EXPORT_BYTES" \
        --output-format=json >"$WORK/out.json"
      python3 - "$WORK/out.json" "$name" "$target" "$rep" >>"$RESULTS" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):])  # fio prints a banner before the JSON
j = d["jobs"][0]
io = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print(json.dumps({"job": sys.argv[2], "target": sys.argv[3], "rep": int(sys.argv[4]),
                  "iops": io["iops"], "mbps": io["bw_bytes"] / 1e6,
                  "lat_us": io["lat_ns"]["mean"] / 1000}))
PY
    done
  done
done
python3 - "$RESULTS" <<'PY'
import json, sys, collections, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["job"], r["target"])].append(r)
jobs = list(dict.fromkeys(r["job"] for r in rows))
print(f"| job | sbod IOPS | nbdkit IOPS | sbod MB/s | nbdkit MB/s | sbod lat us | nbdkit lat us | sbod/nbdkit |")
print(f"|---|---:|---:|---:|---:|---:|---:|---:|")
for j in jobs:
    s = statistics.mean(r["iops"] for r in by[(j, "sbod")])
    n = statistics.mean(r["iops"] for r in by[(j, "nbdkit")])
    sm = statistics.mean(r["mbps"] for r in by[(j, "sbod")])
    nm = statistics.mean(r["mbps"] for r in by[(j, "nbdkit")])
    sl = statistics.mean(r["lat_us"] for r in by[(j, "sbod")])
    nl = statistics.mean(r["lat_us"] for r in by[(j, "nbdkit")])
    print(f"| {j} | {s:,.0f} | {n:,.0f} | {sm:,.1f} | {nm:,.1f} | {sl:,.1f} | {nl:,.1f} | {s/n:.2f} |")
PY

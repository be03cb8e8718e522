#!/usr/bin/env bash
# The sync modes side by side in one run, as the field measured ZFS's: synchronous writes
# disabled (acknowledged at once), written straight into the pool (standard: a FLUSH after
# every write, FUA), every write FUA (always), and a log device on fast storage (standard,
# with the log journaling every write). One array, raid5 of 4 member files on the slowest
# storage here (the VM's disk), the log on tmpfs; the mode is switched with `sbod set
# --sync` between jobs, and the log added (`sbod add --log`) for its job and removed after,
# so every mode runs on the same files, interleaved. fio's nbd engine over a Unix socket,
# QD1, a FLUSH after every write (--fsync=1).
#
#   scripts/bench-sync.sh [--runtime SECONDS] [--size SIZE] [--repeat N] [--dir DIR]
#                         [--flush-delay MS]
#
# Defaults: 10 s per job, 1G per member, 1 repetition, members under $TMPDIR (or /var/tmp).
# --flush-delay MS serves each member file through nbdkit (bench/slowflush.c: every FLUSH,
# and every FUA write, fdatasyncs the file and then waits MS), as a disk whose cache flush
# costs MS; the array then uses them as nbd+unix:// members.
# Prints MB/s and IOPS per mode and the ratios to sync=disabled and to the in-pool path.
# Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=10
SIZE=1G
REPEAT=1
DIR=${TMPDIR:-/var/tmp}
FLUSH_DELAY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --flush-delay) FLUSH_DELAY=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
cargo build --release -q -p sbod
SBOD=$PWD/target/release/sbod

WORK=$(mktemp -d "$DIR/sbod-bench-sync.XXXXXX")
SHM=$(mktemp -d /dev/shm/sbod-bench-sync.XXXXXX)
export SBOD_STATE_DIR=$WORK/state
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT

truncate -s 256M "$SHM/log.img"
if [ "$FLUSH_DELAY" = 0 ]; then
  MEMBERS=("$WORK"/m{0,1,2,3}.img)
  $SBOD create bench --level raid5 --size-each "$SIZE" --preallocate "${MEMBERS[@]}" >/dev/null
else
  MEMBERS=()
  for i in 0 1 2 3; do
    # The member's space and its metadata area, allocated up front as --preallocate does.
    truncate -s "$SIZE" "$WORK/m$i.img"
    truncate -s +64M "$WORK/m$i.img"
    fallocate -l "$(stat -c %s "$WORK/m$i.img")" "$WORK/m$i.img"
    nbdkit -f --exit-with-parent -U "$WORK/m$i.sock" \
      cc bench/slowflush.c file="$WORK/m$i.img" flush_ms="$FLUSH_DELAY" &
    PIDS+=($!)
    MEMBERS+=("nbd+unix:///?socket=$WORK/m$i.sock")
  done
  for i in 0 1 2 3; do
    for _ in $(seq 100); do [ -S "$WORK/m$i.sock" ] && break; sleep 0.1; done
  done
  $SBOD create bench --level raid5 "${MEMBERS[@]}" >/dev/null
fi
$SBOD serve bench --nbd "unix:$WORK/sbod.sock" 2>"$WORK/sbod.log" &
PIDS+=($!)
URI="nbd+unix:///?socket=$WORK/sbod.sock"
for _ in $(seq 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.1; done
EXPORT_BYTES=$(nbdinfo --size "$URI")
# The working set: 1 GiB of the volume (or all of it), written once so that no job pays
# for first writes to the member files.
WSET=$(( EXPORT_BYTES < (1 << 30) ? EXPORT_BYTES : (1 << 30) ))
$SBOD set bench --sync disabled >/dev/null 2>&1
fio --name=precondition --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 \
  --size="$WSET" --output=/dev/null

MODES="disabled standard always log"
JOBS=(
  "seq-1M-fsync:--rw=write --bs=1M"
  "rand-4K-fsync:--rw=randwrite --bs=4k"
)
RESULTS=$WORK/results.jsonl
for rep in $(seq "$REPEAT"); do
  for job in "${JOBS[@]}"; do
    name=${job%%:*}; opts=${job#*:}
    for mode in $MODES; do
      # "log": the in-pool mode with the log journaling every write (added for the job:
      # the other modes run without it).
      case "$mode" in
        log)
          $SBOD set bench --sync standard >/dev/null 2>&1
          $SBOD add bench --log "$SHM/log.img" >/dev/null
          $SBOD status bench --json | python3 -c 'import json,sys; l=json.load(sys.stdin)["log"]; assert l["journaling"], l'
          ;;
        *) $SBOD set bench --sync "$mode" >/dev/null 2>&1 ;;
      esac
      # shellcheck disable=SC2086
      fio --name="$name" --ioengine=nbd --uri="$URI" $opts --iodepth=1 --fsync=1 \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --size="$WSET" \
        --output-format=json >"$WORK/out.json"
      python3 - "$WORK/out.json" "$name" "$mode" "$rep" >>"$RESULTS" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):])  # fio prints a banner before the JSON
w = d["jobs"][0]["write"]
print(json.dumps({"job": sys.argv[2], "mode": sys.argv[3], "rep": int(sys.argv[4]),
                  "iops": w["iops"], "mbps": w["bw_bytes"] / 1e6,
                  "lat_us": w["lat_ns"]["mean"] / 1000}))
PY
      if [ "$mode" = log ]; then
        $SBOD remove bench "$SHM/log.img" >/dev/null
      fi
    done
  done
done
python3 - "$RESULTS" <<'PY'
import json, sys, collections, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["job"], r["mode"])].append(r)
jobs = list(dict.fromkeys(r["job"] for r in rows))
modes = list(dict.fromkeys(r["mode"] for r in rows))
mean = lambda j, m, k: statistics.mean(r[k] for r in by[(j, m)])
print("| job | mode | MB/s | writes/s | per write + FLUSH | / disabled | / standard (in-pool) |")
print("|---|---|---:|---:|---:|---:|---:|")
for j in jobs:
    d, s = mean(j, "disabled", "mbps"), mean(j, "standard", "mbps")
    for m in modes:
        v = mean(j, m, "mbps")
        iops = mean(j, m, "iops")
        print(f"| {j} | {m} | {v:,.1f} | {iops:,.0f} | "
              f"{1e6 / iops:,.0f} us | {v / d:.2f} | {v / s:.2f} |")
PY

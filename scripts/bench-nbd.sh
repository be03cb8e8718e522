#!/usr/bin/env bash
# Side-by-side NBD benchmark: sbod serving a raid0 of one member on tmpfs, and nbdkit's file
# plugin serving a file of the same size on the same tmpfs, driven by the same fio jobs
# (fio's nbd engine over a Unix socket) in one run. Prints IOPS, MB/s and sbod/nbdkit.
#
#   scripts/bench-nbd.sh [--runtime SECONDS] [--size SIZE] [--repeat N] [--jobs LIST]
#                        [--integrity crc32c|none] [--sbod BIN] [--sbod-b BIN]
#
# --sbod serves with that binary instead of building one; --sbod-b adds a second sbod
# (another build: the before of an A/B) serving its own copy of the same array, taking turns
# with the other two, so every ratio is measured side by side. Each server's CPU time
# (user + system, all threads, from /proc/PID/stat) over each job gives "CPU us/req", the
# server's CPU per request (its IOPS per CPU%: 10^4 / that), steadier than IOPS on a shared
# machine; "host busy %" is the whole machine's busy share over each job (every CPU, from
# /proc/stat: fio and the server together); the ratio columns give the mean and the range
# of the per-repetition ratios.
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
INTEGRITY=crc32c
SBOD=
SBOD_B=
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --jobs) ONLY=$2; shift 2 ;;
    --integrity) INTEGRITY=$2; shift 2 ;;
    --sbod) SBOD=$(realpath "$2"); shift 2 ;;
    --sbod-b) SBOD_B=$(realpath "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
if [ -z "$SBOD" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi

WORK=$(mktemp -d /dev/shm/sbod-bench.XXXXXX)
export SBOD_STATE_DIR=$WORK/state
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

$SBOD create bench --level raid0 --integrity "$INTEGRITY" --size-each "$SIZE" "$WORK/m0.img" >/dev/null
TARGETS=(sbod nbdkit)
if [ -n "$SBOD_B" ]; then
  # The other build's own array (same layout, its own state directory and member).
  SBOD_STATE_DIR=$WORK/state-b $SBOD_B create bench --level raid0 --integrity "$INTEGRITY" \
    --size-each "$SIZE" "$WORK/mb.img" >/dev/null
  TARGETS=(sbod nbdkit sbod-b)
fi
# nbdkit gets a file with exactly the export size sbod presents.
EXPORT_BYTES=$($SBOD status bench --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
truncate -s "$EXPORT_BYTES" "$WORK/plain.img"

declare -A PID_OF
$SBOD serve bench --nbd "unix:$WORK/sbod.sock" 2>"$WORK/sbod.log" &
PIDS+=($!); PID_OF[sbod]=$!
nbdkit --foreground --exit-with-parent --unix "$WORK/nbdkit.sock" file "$WORK/plain.img" 2>"$WORK/nbdkit.log" &
PIDS+=($!); PID_OF[nbdkit]=$!
if [ -n "$SBOD_B" ]; then
  SBOD_STATE_DIR=$WORK/state-b $SBOD_B serve bench --nbd "unix:$WORK/sbod-b.sock" 2>"$WORK/sbod-b.log" &
  PIDS+=($!); PID_OF[sbod-b]=$!
fi
# CPU seconds (user + system, every thread) a process has used.
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
# The whole host's busy and total jiffies (every CPU), for its busy share over a job.
host_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
for s in "${TARGETS[@]}"; do
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
    # Rotate which target goes first, so none always runs on a warmer machine.
    n=${#TARGETS[@]}
    order=()
    for i in $(seq 0 $((n - 1))); do order+=("${TARGETS[$(((i + rep) % n))]}"); done
    for target in "${order[@]}"; do
      c0=$(cpu_of "${PID_OF[$target]}")
      h0=$(host_ticks)
      # shellcheck disable=SC2086
      fio --name="$name" --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/$target.sock" $opts \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --size="$EXPORT_BYTES" \
        --output-format=json >"$WORK/out.json"
      c1=$(cpu_of "${PID_OF[$target]}")
      h1=$(host_ticks)
      python3 - "$WORK/out.json" "$name" "$target" "$rep" "$c0" "$c1" "$RUNTIME" "$h0" "$h1" >>"$RESULTS" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):])  # fio prints a banner before the JSON
j = d["jobs"][0]
io = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
# The server's CPU over the whole job, ramp included, against the requests of the whole job
# (at the measured rate: fio does not count those of the ramp).
cpu = float(sys.argv[6]) - float(sys.argv[5])
reqs = io["iops"] * (float(sys.argv[7]) + 1)
# The host's busy share over the job (fio, the server and anything else on the machine):
# a server that leaves the host idle while its one connection waits on it is bound by
# one core, not by the machine.
b0, t0 = map(int, sys.argv[8].split())
b1, t1 = map(int, sys.argv[9].split())
busy = (b1 - b0) / max(t1 - t0, 1)
print(json.dumps({"job": sys.argv[2], "target": sys.argv[3], "rep": int(sys.argv[4]),
                  "iops": io["iops"], "mbps": io["bw_bytes"] / 1e6,
                  "lat_us": io["lat_ns"]["mean"] / 1000,
                  "cpu_s": cpu, "reqs": reqs, "busy": busy}))
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
targets = [t for t in ("sbod", "nbdkit", "sbod-b") if any(r["target"] == t for r in rows)]
mean = lambda j, t, k: statistics.mean(r[k] for r in by[(j, t)])
def cpu_us(j, t):
    return 1e6 * sum(r["cpu_s"] for r in by[(j, t)]) / max(sum(r["reqs"] for r in by[(j, t)]), 1)
def ratio(j, a, b, key):
    # Per repetition (the two ran side by side), then the mean and the range.
    ra = {r["rep"]: r for r in by[(j, a)]}
    rb = {r["rep"]: r for r in by[(j, b)]}
    v = [key(ra[k]) / key(rb[k]) for k in ra if k in rb and key(rb[k]) > 0]
    if not v:
        return "-"
    if len(v) == 1:
        return f"{v[0]:.2f}"
    return f"{statistics.mean(v):.2f} ({min(v):.2f}-{max(v):.2f})"
iops = lambda r: r["iops"]
cpr = lambda r: r["cpu_s"] / max(r["reqs"], 1)
head = "| job |" + "".join(f" {t} IOPS |" for t in targets) + "".join(f" {t} MB/s |" for t in targets)
head += "".join(f" {t} lat us |" for t in targets) + "".join(f" {t} CPU us/req |" for t in targets)
head += "".join(f" host busy % ({t}) |" for t in targets)
head += " sbod/nbdkit IOPS | nbdkit/sbod CPU per req |"
if "sbod-b" in targets:
    head += " sbod-b/nbdkit IOPS | sbod/sbod-b IOPS | sbod-b/sbod CPU per req |"
print(head)
print("|---|" + "---:|" * (head.count("|") - 2))
for j in jobs:
    line = f"| {j} |"
    line += "".join(f" {mean(j, t, 'iops'):,.0f} |" for t in targets)
    line += "".join(f" {mean(j, t, 'mbps'):,.1f} |" for t in targets)
    line += "".join(f" {mean(j, t, 'lat_us'):,.1f} |" for t in targets)
    line += "".join(f" {cpu_us(j, t):,.1f} |" for t in targets)
    line += "".join(f" {100 * mean(j, t, 'busy'):.0f} |" for t in targets)
    line += f" {ratio(j, 'sbod', 'nbdkit', iops)} | {ratio(j, 'nbdkit', 'sbod', cpr)} |"
    if "sbod-b" in targets:
        line += f" {ratio(j, 'sbod-b', 'nbdkit', iops)} | {ratio(j, 'sbod', 'sbod-b', iops)} | {ratio(j, 'sbod-b', 'sbod', cpr)} |"
    print(line)
PY

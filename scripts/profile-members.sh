#!/usr/bin/env bash
# What the members of an array see for each client job: member I/Os and bytes per client
# request (reads during writes: partial-stripe read-modify-write), the mean member request
# size after the block layer merged what it could, the members' queue depth over time, and
# what the server spent per client request (CPU, context switches). Counts, not times, so
# they hold on a noisy machine. See docs/PERFORMANCE.md.
#
#   scripts/profile-members.sh                          # raid6 of 8 loop devices, 64K chunks
#   scripts/profile-members.sh --level raid6 --members 10 --chunk 128K
#   scripts/profile-members.sh --place disk --jobs seqwrite-1M,seqwrite-768K
#
# Options (defaults): --place loop (loop devices over files on the repo's disk, direct I/O;
# needs root), disk (member files there) or shm (member files in /dev/shm; for files the
# member counts come from `sbod status`: no sizes or depths); --level raid6 --members 8
# --groups 1 --chunk 64K --size-each 512M --runtime 5 --jobs LIST (names below)
# --numjobs 1 (fio jobs per measurement, each its own connection) --cpus LIST (run the
# server under `taskset -c LIST`) --dir DIR (where member files go; default a temporary
# folder in the repo).
# Environment: SBOD=path/to/sbod skips the build; SBOD_IO, SBOD_URING_MERGE pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
PLACE=loop
LEVEL=raid6
MEMBERS=8
CHUNK=64K
GROUPS_=1
NUMJOBS=1
CPUS=
INTEGRITY=crc32c
SIZE_EACH=512M
RUNTIME=5
ONLY=seqwrite-1M,seqread-1M,seqwrite-768K
DIR=
while [ $# -gt 0 ]; do
  case "$1" in
    --place) PLACE=$2; shift 2 ;;
    --level) LEVEL=$2; shift 2 ;;
    --members) MEMBERS=$2; shift 2 ;;
    --chunk) CHUNK=$2; shift 2 ;;
    --groups) GROUPS_=$2; shift 2 ;;
    --numjobs) NUMJOBS=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --integrity) INTEGRITY=$2; shift 2 ;;
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --jobs) ONLY=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
JOBS=(
  "seqwrite-1M:--rw=write --bs=1M --iodepth=16"
  "seqread-1M:--rw=read --bs=1M --iodepth=16"
  "seqwrite-768K:--rw=write --bs=768K --iodepth=16"
  "seqread-768K:--rw=read --bs=768K --iodepth=16"
  "seqwrite-128K:--rw=write --bs=128K --iodepth=16"
  "seqwrite-1M-qd1:--rw=write --bs=1M --iodepth=1"
  "seqwrite-1M-qd2:--rw=write --bs=1M --iodepth=2"
  "randwrite-4K:--rw=randwrite --bs=4k --iodepth=32"
  "randread-4K:--rw=randread --bs=4k --iodepth=32"
  "randread-4K-qd1:--rw=randread --bs=4k --iodepth=1"
)
source scripts/deps.sh
if [ -z "${SBOD:-}" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi
[ "$PLACE" = loop ] && [ "$(id -u)" != 0 ] && { echo "--place loop needs root" >&2; exit 2; }

[ "$PLACE" = shm ] && DIR=${DIR:-/dev/shm}
WORK=$(mktemp -d "${DIR:-$PWD}/.sbod-profile.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
LOOPS=()
SPID=
cleanup() {
  [ -n "$SPID" ] && { kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; }
  "$SBOD" forget prof >/dev/null 2>&1 || true
  for d in "${LOOPS[@]}"; do losetup -d "$d" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
members=()
for i in $(seq 0 $((MEMBERS - 1))); do
  f=$WORK/m$i.img
  truncate -s "$SIZE_EACH" "$f"
  if [ "$PLACE" = loop ]; then
    d=$(losetup --direct-io=on -f --show "$f")
    LOOPS+=("$d")
    members+=("$d")
  else
    members+=("$f")
  fi
done
"$SBOD" create prof --level "$LEVEL" --chunk "$CHUNK" --groups "$GROUPS_" --integrity "$INTEGRITY" \
  --assume-clean "${members[@]}" >/dev/null
PIN=()
[ -n "$CPUS" ] && PIN=(taskset -c "$CPUS")
"${PIN[@]}" "$SBOD" serve prof --nbd "unix:$WORK/s.sock" 2>"$WORK/serve.log" &
SPID=$!
URI="nbd+unix:///?socket=$WORK/s.sock"
for _ in $(seq 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.1; done
SIZE=$(nbdinfo --size "$URI")
WS=$((SIZE < 1073741824 ? SIZE : 1073741824))
# Fill the working set once, so reads read data and writes overwrite allocated blocks.
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=16 --size="$WS" \
  --output-format=terse >/dev/null

# One line of counters: per member "rd_ios rd_sectors wr_ios wr_sectors" (loop devices),
# or the array's member read and write counts (files); then the server's CPU ticks and
# context switches over all its threads.
snap() {
  if [ "$PLACE" = loop ]; then
    for d in "${LOOPS[@]}"; do
      awk '{printf "%s %s %s %s ", $1, $3, $5, $7}' "/sys/block/${d#/dev/}/stat"
    done
  else
    "$SBOD" status prof --json |
      python3 -c 'import json,sys; print(" ".join("%d 0 %d 0" % (m["reads"], m["writes"]) for m in json.load(sys.stdin)["members"]), end=" ")'
  fi
  cat /proc/"$SPID"/task/*/stat | awk '{u+=$14; s+=$15} END{printf "%d ", u+s}'
  cat /proc/"$SPID"/task/*/status | awk '/ctxt_switches/{c+=$2} END{print c}'
}
depths() {  # sample every member's in-flight requests every 50 ms while fio runs
  while :; do
    line=""
    for d in "${LOOPS[@]}"; do
      read -r r w <"/sys/block/${d#/dev/}/inflight"
      line+="$((r + w)) "
    done
    echo "$line"
    sleep 0.05
  done
}

echo "# profile-members: $LEVEL of $MEMBERS ${PLACE} members in $GROUPS_ group(s), chunk $CHUNK; server on CPUs ${CPUS:-all} of $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg); $NUMJOBS fio job(s) x ${RUNTIME}s per job"
echo "| job | client MB/s | member reads / req | member writes / req | read KiB / req | write KiB / req | KiB per member read | KiB per member write | member QD mean (max) | server CPU ms / req | ctx switches / req |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for job in "${JOBS[@]}"; do
  name=${job%%:*}; opts=${job#*:}
  [[ ",$ONLY," == *",$name,"* ]] || continue
  DPID=
  if [ "$PLACE" = loop ]; then depths >"$WORK/depth.txt" & DPID=$!; fi
  before=$(snap)
  # shellcheck disable=SC2086
  # Several jobs each take their own slice of the working set.
  fio --name="$name" --ioengine=nbd --uri="$URI" $opts --size=$((WS / NUMJOBS)) \
    --offset_increment=$((WS / NUMJOBS)) --time_based --runtime="$RUNTIME" \
    --numjobs="$NUMJOBS" --group_reporting --output-format=json \
    >"$WORK/fio.json" 2>/dev/null
  after=$(snap)
  [ -n "$DPID" ] && { kill "$DPID"; wait "$DPID" 2>/dev/null || true; }
  python3 - "$WORK/fio.json" "$name" "$MEMBERS" "$before" "$after" "$WORK/depth.txt" "$(getconf CLK_TCK)" <<'PY'
import json, sys, os
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])["jobs"][0]
name, n = sys.argv[2], int(sys.argv[3])
b = [int(x) for x in sys.argv[4].split()]
a = [int(x) for x in sys.argv[5].split()]
d = [y - x for x, y in zip(b, a)]
reqs = j["read"]["total_ios"] + j["write"]["total_ios"]
mbps = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6
rd_ios = sum(d[4 * i] for i in range(n)); rd_sec = sum(d[4 * i + 1] for i in range(n))
wr_ios = sum(d[4 * i + 2] for i in range(n)); wr_sec = sum(d[4 * i + 3] for i in range(n))
ticks, cs = d[4 * n], d[4 * n + 1]
hz = int(sys.argv[7])
f = lambda x, p=1: f"{x:.{p}f}"
per = lambda x: x / reqs if reqs else 0
size = lambda sec, ios: f(sec * 512 / 1024 / ios) if ios and sec else "-"
qd = "-"
if os.path.exists(sys.argv[6]) and os.path.getsize(sys.argv[6]):
    rows = [[int(v) for v in l.split()] for l in open(sys.argv[6]) if l.strip()]
    vals = [v for r in rows for v in r]
    busy = [v for v in vals if v] or [0]
    qd = f"{sum(vals) / len(vals):.1f} ({max(vals)})"
print(f"| {name} | {f(mbps, 0)} | {f(per(rd_ios), 2)} | {f(per(wr_ios), 2)} | "
      f"{f(per(rd_sec) * 512 / 1024, 0) if rd_sec else '-'} | {f(per(wr_sec) * 512 / 1024, 0) if wr_sec else '-'} | "
      f"{size(rd_sec, rd_ios)} | {size(wr_sec, wr_ios)} | {qd} | "
      f"{f(per(ticks) * 1000 / hz, 3)} | {f(per(cs), 1)} |")
PY
done

#!/usr/bin/env bash
# Parity arrays against their members, side by side in one run, through the lab
# (`sbod bench`): for every place (file members on the repo's disk with O_DIRECT; loop
# devices over such files) and every level (raid5, raid6, ec:K+M by default), one set of
# member files is created, each level is created on it in turn and measured by `sbod bench
# --destructive` (BASELINE: the same members served alone; NOMINAL; DEVICE DOWN), and the
# ratios to BASELINE are printed against issue 19's aims:
#   sequential read  >= 0.9 x (N-M)/N     sequential write >= 0.8 x (N-M)/N
#   DEVICE DOWN sequential read >= 0.7 x (N-M)/N
# 4K random jobs are printed without an aim. See docs/PERFORMANCE.md.
#
#   scripts/bench-raid.sh                      # defaults below: a few minutes
#   scripts/bench-raid.sh --places disk --levels raid6 --runtime 5 --reps 2
#   scripts/bench-raid.sh --workloads seqwrite-1m --phases baseline,nominal
#
# Options (defaults):
#   --places disk,loop          where the members live
#   --levels raid5,raid6,ec:6+2 levels to measure, each on the same members
#   --members 8                 members per array
#   --size-each 512M            size of each member file
#   --chunk 64K                 chunk size
#   --workloads seqread-1m,seqwrite-1m,randread-4k,randwrite-4k
#   --phases baseline,nominal,device-down
#   --runtime 3 --ramp 1 --reps 1     per measurement
#   --working-set 1G            bytes of the volume addressed
#   --precondition seq          none, seq or full (lab's meaning)
#   --dir DIR                   where member files go (default: a temporary folder
#                               under the repo, i.e. on the repo's disk)
#   --json-out FILE             also write the summary rows as JSON lines
#   --reports DIR               keep each level's lab report (bench.json) in DIR, as
#                               LEVEL.json (scripts/lab-grid.sh compares them to the planner)
#   --integrity crc32c          checksums of the RAID arrays (crc32c or none; BASELINE has none)
#   --bitmap-region SIZE        the arrays' write-intent bitmap region (default: sbod's choice
#                               for the member size)
#   --drives PROFILE[,OPTIONS]  the members are modelled drives (model:PROFILE:FILE, see
#                               docs/LAB.md "Modelled drives"), place disk only; the table
#                               then shows the lab's layout ideal and issue 31's aims
#                               (docs/LAB.md, "The layout's ideal") instead of issue 19's
#   --fill                      write the member files in full (zeros) before the first
#                               array: members with no holes cannot refuse a write for
#                               space, so degraded writes keep no old rows (default with
#                               --drives; --no-fill leaves them sparse)
#   --create-args "ARGS"        more arguments for `sbod create` (e.g. "--declustered
#                               --spares 1", "--copies 2")
#   --connections auto          client connections of the array's jobs (`sbod bench
#                               --connections`: auto, as many as BASELINE's; 1 as before)
# Environment: SBOD=path/to/sbod skips the build; SBOD_IO etc. pass through to the servers.
set -euo pipefail
cd "$(dirname "$0")/.."
PLACES=disk,loop
LEVELS=raid5,raid6,ec:6+2
MEMBERS=8
SIZE_EACH=512M
CHUNK=64K
WORKLOADS=seqread-1m,seqwrite-1m,randread-4k,randwrite-4k
PHASES=baseline,nominal,device-down
RUNTIME=3
RAMP=1
REPS=1
WS=1G
PRECOND=seq
DIR=
JSON_OUT=
REPORTS=
INTEGRITY=crc32c
DRIVES=
REGION=
FILL=
CREATE_ARGS=
CONNS=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --places) PLACES=$2; shift 2 ;;
    --levels) LEVELS=$2; shift 2 ;;
    --members) MEMBERS=$2; shift 2 ;;
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --chunk) CHUNK=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --phases) PHASES=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --ramp) RAMP=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --working-set) WS=$2; shift 2 ;;
    --precondition) PRECOND=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --json-out) JSON_OUT=$2; shift 2 ;;
    --reports) REPORTS=$2; shift 2 ;;
    --integrity) INTEGRITY=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    --bitmap-region) REGION=$2; shift 2 ;;
    --fill) FILL=1; shift ;;
    --no-fill) FILL=0; shift ;;
    --create-args) CREATE_ARGS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
[ -n "$FILL" ] || { [ -n "$DRIVES" ] && FILL=1 || FILL=0; }
# Drives in slow motion (slow=K) take K times longer for everything, the owner block's
# heartbeat included: under a stream a drive's scheduler may hold that read and write back
# for its aging bound (1 s of the drive's time, K s of the wall's) each, past the lease's
# patience (half of 5 beats of 1 s), and the lapsed lease refuses writes. The heartbeat
# runs K times slower with them, unless SBOD_HEARTBEAT_MS is set (docs/LAB.md).
if [[ ",$DRIVES," =~ ,slow=([0-9]+), ]] && [ -z "${SBOD_HEARTBEAT_MS:-}" ]; then
  export SBOD_HEARTBEAT_MS=$((1000 * BASH_REMATCH[1]))
fi
if [ -z "${SBOD:-}" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi
if [[ ",$PLACES," == *,loop,* ]] && [ "$(id -u)" != 0 ]; then
  echo "loop devices need root (losetup); run with --places disk, or as root" >&2
  exit 2
fi

WORK=$(mktemp -d "${DIR:-$PWD}/.sbod-bench-raid.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
LOOPS=()
cleanup() {
  "$SBOD" forget braid >/dev/null 2>&1 || true
  for d in "${LOOPS[@]}"; do losetup -d "$d" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
ROWS=$WORK/rows.jsonl
: >"$ROWS"

echo "# bench-raid: $(uname -sr), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $MEMBERS members of $SIZE_EACH, chunk $CHUNK, $REPS x ${RUNTIME}s (+${RAMP}s ramp), working set $WS, precondition $PRECOND, integrity $INTEGRITY${REGION:+, bitmap region $REGION}${DRIVES:+, modelled drives $DRIVES}"
IFS=, read -r -a places <<<"$PLACES"
IFS=, read -r -a levels <<<"$LEVELS"
for place in "${places[@]}"; do
  mkdir -p "$WORK/$place"
  members=()
  for i in $(seq 0 $((MEMBERS - 1))); do
    f=$WORK/$place/m$i.img
    truncate -s "$SIZE_EACH" "$f"
    if [ "$FILL" = 1 ]; then
      bytes=$(stat -c %s "$f")
      dd if=/dev/zero of="$f" bs=1M count=$((bytes >> 20)) conv=notrunc status=none
    fi
    case "$place" in
      disk) members+=("${DRIVES:+model:$DRIVES:}$f") ;;
      loop)
        [ -z "$DRIVES" ] || { echo "--drives models file members: use --places disk" >&2; exit 2; }
        d=$(losetup --direct-io=on -f --show "$f")
        LOOPS+=("$d")
        members+=("$d")
        ;;
      *) echo "unknown place $place (disk, loop)" >&2; exit 2 ;;
    esac
  done
  for level in "${levels[@]}"; do
    "$SBOD" forget braid >/dev/null 2>&1 || true
    # A previous level's superblocks are on the members: --force.
    # shellcheck disable=SC2086 # CREATE_ARGS is a list of arguments
    "$SBOD" create braid --level "$level" --chunk "$CHUNK" --integrity "$INTEGRITY" --force \
      ${REGION:+--bitmap-region "$REGION"} $CREATE_ARGS \
      "${members[@]}" >/dev/null
    # `create` starts a resync; bench waits for it before it measures.
    out=$WORK/out-$place-${level//[:+]/_}
    echo "## $place $level" >&2
    "$SBOD" bench braid --destructive --workloads "$WORKLOADS" --phases "$PHASES" \
      --runtime "$RUNTIME" --ramp "$RAMP" --reps "$REPS" --precondition "$PRECOND" \
      --working-set "$WS" --connections "$CONNS" --out "$out" >"$WORK/bench.log" 2>&1 || {
      echo "sbod bench failed for $place $level:" >&2
      tail -20 "$WORK/bench.log" >&2
      exit 1
    }
    if [ -n "$REPORTS" ]; then
      mkdir -p "$REPORTS"
      tag=$place-${level//[:+]/_}${CREATE_ARGS:+-${CREATE_ARGS//[^a-z0-9]/}}
      cp "$out/bench.json" "$REPORTS/$tag.json"
    fi
    python3 - "$out/bench.json" "$place" "$level${CREATE_ARGS:+ $CREATE_ARGS}" "$MEMBERS" "${DRIVES:+drives}" >>"$ROWS" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
place, level, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
drives = sys.argv[5] == "drives"
ideal = None
if drives:
    pass
elif level.startswith("ec:"):
    k, m = (int(x) for x in level[3:].split("+"))
    assert k + m == n, f"{level} needs {k+m} members, not {n}"
    ideal = (n - m) / n
else:
    m = {"raid5": 1, "raid6": 2}.get(level, 0)
    ideal = (n - m) / n
cells = {(c["phase"], c["workload"]): c for c in rep["cells"]}
for (phase, wl), c in sorted(cells.items()):
    if phase == "baseline":
        continue
    base = cells.get(("baseline", wl))
    aim = None
    if drives:
        # The lab's layout ideal and issue 31's aims (docs/LAB.md, "The layout's ideal").
        i = c.get("ideal") or {}
        ideal = i.get("ratio")
        aim = i.get("aim")
    elif wl.startswith("seqread"):
        aim = (0.9 if phase == "nominal" else 0.7 if phase == "device-down" else None)
    elif wl.startswith("seqwrite") and phase == "nominal":
        aim = 0.8
    row = {
        "place": place, "level": level, "phase": phase, "workload": wl,
        "ideal": ideal, "aim": aim * ideal if aim and ideal else None,
        "mbps": c["mean"]["bw_bytes"] / 1e6, "iops": c["mean"]["iops"],
        "base_mbps": base["mean"]["bw_bytes"] / 1e6 if base else None,
        "base_iops": base["mean"]["iops"] if base else None,
        # Random 4K jobs by IOPS, as the lab's ideal is: on slow modelled drives they move a
        # few KiB/s, which fio rounds to whole KiB/s, so a bandwidth ratio is off by 30%.
        "ratio": (c["vs_baseline"] or {}).get("bw_bytes" if wl.startswith("seq") else "iops"),
        "cpu_pct": c["mean"]["server_cpu_pct"],
        "flagged": c["flagged"],
    }
    print(json.dumps(row))
PY
  done
done

[ -n "$JSON_OUT" ] && cp "$ROWS" "$JSON_OUT"
python3 - "$ROWS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# Streams in MB/s, random jobs in IOPS (what their ratio is taken of: on slow drives they
# move well under 1 MB/s).
print("| place | level | phase | workload | BASELINE | measured | ratio | ideal | aim | met |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
missed = 0
for r in rows:
    aim = r["aim"]
    ok = "" if aim is None or r["ratio"] is None else ("yes" if r["ratio"] >= aim else "**no**")
    missed += ok == "**no**"
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"
    flag = " ⚠" if r["flagged"] else ""
    seq = r["workload"].startswith("seq")
    def amount(mbps, iops):
        x = mbps if seq else iops
        return "-" if x is None else (f"{x:,.0f} MB/s" if seq else f"{x:,.0f} IOPS")
    print(f"| {r['place']} | {r['level']} | {r['phase']} | {r['workload']} "
          f"| {amount(r['base_mbps'], r.get('base_iops'))} "
          f"| {amount(r['mbps'], r['iops'])}{flag} | {f(r['ratio'])} | {f(r['ideal'])} | {f(aim)} | {ok} |")
print(f"\n{missed} aim(s) not met" if missed else "\nevery aim met")
PY

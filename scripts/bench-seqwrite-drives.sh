#!/usr/bin/env bash
# One sequential writer on an array of modelled drives, and what each drive did: the
# client's MB/s, the server's CPU, and per drive (SBOD_DRIVE_STATS=1) its writes, FUA
# writes, FLUSHes and media time by kind (docs/LAB.md). For A/B runs of what the engine does
# around a sequential write on drives: the write-intent bitmap's region and the regions it
# sets ahead of a writer (SBOD_BITMAP_AHEAD), the sweeper's flushes, the layout
# (docs/PERFORMANCE.md, "The write-intent bitmap ahead of a writer").
# The array: raid6 in G groups of 10 plus S hot spares, or as many members declustered.
# Not part of the test suite.
#
#   scripts/bench-seqwrite-drives.sh                                # 24 x 1G, 2 groups + 4 spares
#   scripts/bench-seqwrite-drives.sh --declustered --ahead 0        # the bitmap's ahead off
#   scripts/bench-seqwrite-drives.sh --bitmap-region 64M --drives hdd-nearline,slow=8
#
# Options (defaults): --groups 2 --spares 4 --size-each 1G --runtime 8 --iodepth 16
#   --drives hdd-nearline,slow=8,span=size --declustered --bitmap-region SIZE (sbod's
#   choice) --ahead SIZE (SBOD_BITMAP_AHEAD for the server; its default when not given)
#   --dir DIR (default /dev/shm) --drive-lines N (drives printed, default 2)
# Environment: SBOD=path/to/sbod skips the build.
set -euo pipefail
cd "$(dirname "$0")/.."
GROUPS_=2
SPARES=4
SIZE_EACH=1G
RUNTIME=8
QD=16
DRIVES=hdd-nearline,slow=8,span=size
DECL=
REGION=
AHEAD=
DIR=/dev/shm
LINES=2
while [ $# -gt 0 ]; do
  case "$1" in
    --groups) GROUPS_=$2; shift 2 ;;
    --spares) SPARES=$2; shift 2 ;;
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --iodepth) QD=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    --declustered) DECL=--declustered; shift ;;
    --bitmap-region) REGION=$2; shift 2 ;;
    --ahead) AHEAD=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --drive-lines) LINES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
export PATH="$HOME/.cargo/bin:$PATH"
for t in fio nbdinfo python3; do
  command -v "$t" >/dev/null || { echo "bench-seqwrite-drives: needs $t: install it (scripts/deps.sh)" >&2; exit 1; }
done
# The heartbeat slowed with the drives (see scripts/bench-declustered.sh).
if [[ ",$DRIVES," =~ ,slow=([0-9]+), ]] && [ -z "${SBOD_HEARTBEAT_MS:-}" ]; then
  export SBOD_HEARTBEAT_MS=$((1000 * BASH_REMATCH[1]))
fi
if [ -z "${SBOD:-}" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi
WORK=$(mktemp -d "$DIR/.sbod-seqwrite.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then
    "$SBOD" stop a >/dev/null 2>&1 || kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
N=$((GROUPS_ * 10 + SPARES))
m=(); for i in $(seq 0 $((N - 1))); do m+=("model:$DRIVES:$WORK/m$i.img"); done
# Its output only if it fails (a sparse-files warning otherwise, on tmpfs).
if ! out=$("$SBOD" create a --level raid6 --groups "$GROUPS_" --spares "$SPARES" $DECL \
  --size-each "$SIZE_EACH" ${REGION:+--bitmap-region "$REGION"} --assume-clean "${m[@]}" 2>&1); then
  echo "$out" >&2
  exit 1
fi
sock=$WORK/s
uri="nbd+unix:///?socket=$sock"
env ${AHEAD:+SBOD_BITMAP_AHEAD=$AHEAD} SBOD_DRIVE_STATS=1 "$SBOD" serve a --nbd "unix:$sock" \
  >/dev/null 2>"$WORK/log" &
SERVER=$!
for _ in $(seq 1 300); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.1; done
region=$("$SBOD" status a --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["bitmap_region"])')
hz=$(getconf CLK_TCK)
c0=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
mbs=$(fio --name=w --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth="$QD" --direct=1 \
  --time_based --runtime="$RUNTIME" --size="$(nbdinfo --size "$uri")" --output-format=json 2>/dev/null |
  python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); print("%.1f" % (d["jobs"][0]["write"]["bw_bytes"] / 1e6))')
c1=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
"$SBOD" stop a >/dev/null
wait "$SERVER" || true
SERVER=
echo "raid6 ${DECL:+declustered }$N x $SIZE_EACH ($DRIVES), bitmap region $region, SBOD_BITMAP_AHEAD ${AHEAD:-default}:"
echo "  1M sequential write QD$QD: $mbs MB/s; server CPU $(python3 -c "print('%.2f' % (($c1 - $c0) / $hz / $RUNTIME))") cores"
grep -E "reads,.*writes|media time by kind" "$WORK/log" | sed 's/^model:[^:]*:[^ ]*\/\(m[0-9]*\.img\)/\1/' |
  head -$((2 * LINES)) | sed 's/^/  /'

#!/usr/bin/env bash
# The planner against the lab on modelled drives (issue 31, "the planner calibrated on the
# engine"): runs the lab's grid of layouts on 8 modelled HDDs (scripts/bench-raid.sh: raid5,
# raid6, ec:5+3, raid10 and raid6 declustered with one spare's space; BASELINE, NOMINAL and
# DEVICE DOWN; 1M streams and 4K random at the lab's queue depths), keeps every report, and
# runs the live test that compares each measured ratio to BASELINE with `sbod plan`'s
# prediction for the same layout and phase (within 15%), printing the table:
#
#   SBOD_LAB_GRID=DIR cargo test -p sbod-lab --test ideal_vs_plan live_grid -- --nocapture
#
#   scripts/lab-grid.sh                       # slow=4, 1 x 3 s per measurement
#   scripts/lab-grid.sh --slow 8 --runtime 5 --reports /tmp/grid   # keep the reports
#   scripts/lab-grid.sh --compare-only /tmp/grid                    # the test on kept reports
#
# Options (defaults): --slow 4 (the drives in slow motion, docs/LAB.md; say K beside every
# figure), --drives hdd-nearline,wce=off, --runtime 3, --ramp 1, --reps 1, --levels
# raid5,raid6,ec:5+3,raid10, --no-declustered, --reports DIR (default: a temporary folder,
# removed), --dir /dev/shm (member files). Environment: SBOD=path/to/sbod skips the build.
# Time: about 3-8 minutes a layout at slow=4 (raid10 3.5 minutes). raid10's and the
# declustered layout's resync after the lab re-creates them ran at 250-270 KiB/s a member
# until the scrub wrote a stripe's rewrites as one write per member (docs/PERFORMANCE.md,
# "The five layouts at slow=4"); now several MiB/s a member.
set -euo pipefail
cd "$(dirname "$0")/.."
SLOW=4
DRIVES=hdd-nearline,wce=off
RUNTIME=3
RAMP=1
REPS=1
LEVELS=raid5,raid6,ec:5+3,raid10
DECL=1
REPORTS=
DIR=/dev/shm
ONLY=
while [ $# -gt 0 ]; do
  case "$1" in
    --slow) SLOW=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --ramp) RAMP=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --levels) LEVELS=$2; shift 2 ;;
    --no-declustered) DECL=0; shift ;;
    --reports) REPORTS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --compare-only) ONLY=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
compare() {
  SBOD_LAB_GRID=$1 CARGO_INCREMENTAL=0 cargo test -q -p sbod-lab --test ideal_vs_plan live_grid \
    -- --nocapture
}
if [ -n "$ONLY" ]; then
  compare "$ONLY"
  exit
fi
KEEP=1
if [ -z "$REPORTS" ]; then
  REPORTS=$(mktemp -d "${TMPDIR:-/tmp}/sbod-lab-grid.XXXXXX")
  KEEP=0
  trap 'rm -rf "$REPORTS"' EXIT
fi
if [ -z "${SBOD:-}" ]; then
  # The dev profile is optimised (Cargo.toml), and shares its build with the tests.
  CARGO_INCREMENTAL=0 cargo build -q -p sbod
  export SBOD=$PWD/target/debug/sbod
fi
common=(--places disk --members 8 --size-each 512M --drives "$DRIVES,slow=$SLOW"
  --workloads seqread-1m,seqwrite-1m,randread-4k,randwrite-4k
  --phases baseline,nominal,device-down --runtime "$RUNTIME" --ramp "$RAMP" --reps "$REPS"
  --working-set 1G --precondition seq --bitmap-region 128M --dir "$DIR" --reports "$REPORTS"
  # One client connection, as the planner was calibrated: with one per member a
  # sequential workload is eight streams on every drive (docs/LAB.md, "Connections").
  --connections 1)
scripts/bench-raid.sh "${common[@]}" --levels "$LEVELS"
if [ "$DECL" = 1 ]; then
  scripts/bench-raid.sh "${common[@]}" --levels raid6 \
    --create-args "--groups 1 --spares 1 --declustered"
fi
[ "$KEEP" = 1 ] && echo "# reports kept in $REPORTS"
compare "$REPORTS"

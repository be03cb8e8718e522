#!/usr/bin/env bash
# The lab on modelled drives (issue 31): BASELINE (each member served alone) against a
# raid6 of the same members, for sequential 1M write and read and 4K random read, on 8
# modelled 7200 rpm nearline HDDs (docs/LAB.md, "Modelled drives"). The drives' data is in
# sparse files; the time is the model's, so the ratios are what the layout does to drives,
# not CPU per byte. Runs scripts/bench-raid.sh; every option of it can be given after these
# defaults (a later one wins), e.g.
#
#   scripts/bench-drives.sh                                  # 8 x hdd-nearline, raid6
#   scripts/bench-drives.sh --drives hdd-dual --members 12
#   scripts/bench-drives.sh --drives 'hdd-nearline,link=exp0@1G'   # behind a 1 GB/s expander
#
# The arrays get the write-intent bitmap region sbod gives a member of the modelled drive's
# size (128 MiB for 7.68 TB and more), not the 1 MiB it gives the small files that hold the
# data: on a drive every first write to a region costs a FUA write to the bitmap, a seek
# away (--bitmap-region 1M shows it).
#
# See docs/PERFORMANCE.md, "Modelled drives".
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-/dev/shm}
[ -d "$DIR" ] && [ -w "$DIR" ] || DIR=$PWD
exec scripts/bench-raid.sh --places disk --levels raid6 --members 8 --size-each 1G \
  --drives hdd-nearline --workloads seqwrite-1m,seqread-1m,randread-4k \
  --phases baseline,nominal --runtime 5 --ramp 1 --reps 2 --working-set 2G \
  --precondition none --bitmap-region 128M --dir "$DIR" "$@"

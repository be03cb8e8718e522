#!/usr/bin/env bash
# A copy of a mostly empty volume: sparse (nbdcopy asks block status, base:allocation, and
# reads only the data) against full (nbdcopy --no-extents reads every byte), through sbod
# serving a raid5 of 4 member files, and side by side through nbdkit's file plugin serving
# one sparse file with the same contents (the peer: a server that has always had extents).
# The destination is null: (nothing written), so only the source side is measured.
#
#   scripts/bench-sparse-copy.sh [--size-each SIZE] [--data-mib N] [--profile dev|release]
#                                [--dir DIR]
#
# Defaults: 3500M per member (a 10.2 GiB volume), 100 MiB of data in 1 MiB pieces spread
# over the volume, the dev profile (optimised in this workspace), work files under /tmp
# (sparse: they take about the data's size). Prints seconds per copy and the ratios, and
# the member reads sbod counted for each copy. SBOD_BIN=PATH uses that sbod binary instead
# of building one. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_EACH=3500M
DATA_MIB=100
PROFILE=dev
BASE=/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --data-mib) DATA_MIB=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --dir) BASE=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
if [ -n "${SBOD_BIN:-}" ]; then
  SBOD=$SBOD_BIN
else
  cargo build -q --profile "$PROFILE" -p sbod
  case "$PROFILE" in dev) SBOD=$PWD/target/debug/sbod ;; *) SBOD=$PWD/target/$PROFILE/sbod ;; esac
fi

WORK=$(mktemp -d "$BASE/sbod-sparse.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

$SBOD create sparse --level raid5 --chunk 64K --size-each "$SIZE_EACH" \
  "$WORK/m0.img" "$WORK/m1.img" "$WORK/m2.img" "$WORK/m3.img" >/dev/null
BYTES=$($SBOD status sparse --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
truncate -s "$BYTES" "$WORK/plain.img"
$SBOD serve sparse --nbd "unix:$WORK/sbod.sock" 2>"$WORK/sbod.log" &
PIDS+=($!)
nbdkit --foreground --exit-with-parent --unix "$WORK/nbdkit.sock" file "$WORK/plain.img" 2>"$WORK/nbdkit.log" &
PIDS+=($!)
SBOD_URI="nbd+unix:///?socket=$WORK/sbod.sock"
KIT_URI="nbd+unix:///?socket=$WORK/nbdkit.sock"
for u in "$SBOD_URI" "$KIT_URI"; do
  for _ in $(seq 100); do nbdinfo --size "$u" >/dev/null 2>&1 && break; sleep 0.1; done
done

# The same data into both: DATA_MIB pieces of 1 MiB, evenly spread.
for u in "$SBOD_URI" "$KIT_URI"; do
  PATH=/usr/bin:$PATH nbdsh -u "$u" -c "
import random
size = h.get_size()
n = $DATA_MIB
step = (size // n) // 4096 * 4096
rnd = random.Random(1)
for i in range(n):
    h.pwrite(bytes([rnd.randrange(1, 256)]) * (1 << 20), i * step)
h.flush()
"
done

member_reads() {
  $SBOD status sparse --json | python3 -c 'import json,sys; print(sum(m["reads"] for m in json.load(sys.stdin)["members"]))'
}
secs() { python3 -c 'import sys,time; print(f"{time.time():.3f}")'; }
copy() { # URI [--no-extents]
  local t0 t1
  t0=$(secs)
  nbdcopy "$@" null:
  t1=$(secs)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}

GIB=$(python3 -c "print(f'{$BYTES / 2**30:.1f}')")
echo "volume $GIB GiB, $DATA_MIB MiB of data in 1 MiB pieces; nbdcopy SOURCE null:"
r0=$(member_reads); s_sparse=$(copy "$SBOD_URI"); r1=$(member_reads)
s_full=$(copy --no-extents "$SBOD_URI"); r2=$(member_reads)
k_sparse=$(copy "$KIT_URI")
k_full=$(copy --no-extents "$KIT_URI")
printf '%-8s %10s %10s %12s\n' server "sparse s" "full s" "sparse/full"
printf '%-8s %10s %10s %12s\n' sbod "$s_sparse" "$s_full" "$(python3 -c "print(f'{$s_sparse / $s_full:.3f}')")"
printf '%-8s %10s %10s %12s\n' nbdkit "$k_sparse" "$k_full" "$(python3 -c "print(f'{$k_sparse / $k_full:.3f}')")"
echo "sbod member reads: sparse $((r1 - r0)), full $((r2 - r1))"
echo "sbod/nbdkit: sparse $(python3 -c "print(f'{$s_sparse / $k_sparse:.2f}')"), full $(python3 -c "print(f'{$s_full / $k_full:.2f}')")"

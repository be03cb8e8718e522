#!/usr/bin/env bash
# `sbod grow` measured (issue 26), in one run on the same member files:
#   1. the time an idle reshape takes (raid6 of 8 -> 10 by default), and its rate per
#      member (every member is read and rewritten once);
#   2. the same array's rebuild of one member afterwards (fail + replace --wait): the rate
#      per member a rebuild reaches on these members, and reshape/rebuild;
#   3. clients during a reshape at the default rate: 4K random read IOPS (QD16) and 1M
#      sequential write MB/s (QD16), fio's nbd engine, against the same jobs just before;
#   4. the grown array narrowed back (`grow --remove` of the members added, --force: the
#      volume is full), idle: its time and rate per member;
#   5. the narrowed array's chunk doubled (`grow --chunk`, --force), idle: its time and
#      rate per member (every window written aside first: every byte is written twice or
#      more).
# Prints a table; docs/PERFORMANCE.md ("Grow and reshape") records runs with their command.
# Not part of the test suite.
#
#   scripts/bench-grow.sh                              # raid6 8 -> 10, 256M members, tmpfs-like /dev/shm
#   scripts/bench-grow.sh --size-each 1G               # the issue's raid6 of 8 -> 10 at 1 GiB
#   scripts/bench-grow.sh --drives hdd-nearline        # members are modelled drives (docs/LAB.md)
#
# Options (defaults): --level raid6 --members 8 --add 2 --size-each 256M --runtime 5
#   --dir DIR (default /dev/shm if writable, else a folder under the repo)
#   --drives PROFILE[,OPTS]  members are model:PROFILE:FILE
# Environment: SBOD=path/to/sbod skips the build.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVEL=raid6
MEMBERS=8
ADD=2
SIZE_EACH=256M
RUNTIME=5
DIR=
DRIVES=
while [ $# -gt 0 ]; do
  case "$1" in
    --level) LEVEL=$2; shift 2 ;;
    --members) MEMBERS=$2; shift 2 ;;
    --add) ADD=$2; shift 2 ;;
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ -z "${SBOD:-}" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi
if [ -z "$DIR" ]; then
  if [ -w /dev/shm ]; then DIR=/dev/shm; else DIR=$PWD; fi
fi
WORK=$(mktemp -d "$DIR/.sbod-bench-grow.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then
    "$SBOD" stop g >/dev/null 2>&1 || kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
SOCK=$WORK/g.sock
URI="nbd+unix:///?socket=$SOCK"
member() { # name -> member path (modelled drive or file)
  if [ -n "$DRIVES" ]; then echo "model:$DRIVES:$WORK/$1.img"; else echo "$WORK/$1.img"; fi
}
now() { date +%s.%N; }
serve() {
  "$SBOD" serve g --nbd "unix:$SOCK" >/dev/null 2>"$WORK/serve.log" &
  SERVER=$!
  for _ in $(seq 1 300); do nbdinfo --size "$URI" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "sbod serve did not come up" >&2; cat "$WORK/serve.log" >&2; exit 1
}
state() { "$SBOD" status g --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
wait_optimal() { python3 scripts/wait-optimal.py "$SBOD" g; }
fio_job() { # rw bs -> "iops mbps"
  fio --name=j --ioengine=nbd --uri="$URI" --rw="$1" --bs="$2" --iodepth=16 --direct=1 \
    --time_based --runtime="$RUNTIME" --size="$VOL" --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); j=d["jobs"][0]
x=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f %.1f" % (x["iops"], x["bw_bytes"]/1e6))'
}
old=(); new=()
for i in $(seq 0 $((MEMBERS - 1))); do old+=("$(member d$i)"); done
for i in $(seq 0 $((ADD - 1))); do new+=("$(member n$i)"); done
"$SBOD" create g --level "$LEVEL" --size-each "$SIZE_EACH" "${old[@]}" >/dev/null
serve
wait_optimal # modelled drives are not known to be zero: the initial resync first
VOL=$(nbdinfo --size "$URI")
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=16 --size="$VOL" \
  >/dev/null 2>&1

# 3 first (the array as created): clients before, then during a reshape at the default rate.
read -r ri_before _ <<<"$(fio_job randread 4k)"
read -r _ sw_before <<<"$(fio_job write 1M)"
"$SBOD" grow g --add "${new[@]}" --size "$SIZE_EACH" >/dev/null
read -r ri_during _ <<<"$(fio_job randread 4k)"
read -r _ sw_during _ <<<"$(fio_job write 1M)"
during_state=$(state)
wait_optimal
NEWVOL=$(nbdinfo --size "$URI")

# 1: an idle reshape on fresh members of the same kind.
"$SBOD" stop g >/dev/null; wait "$SERVER" 2>/dev/null || true; SERVER=
"$SBOD" forget g >/dev/null
rm -f "$WORK"/*.img
"$SBOD" create g --level "$LEVEL" --size-each "$SIZE_EACH" "${old[@]}" >/dev/null
serve
wait_optimal
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=16 --size="$VOL" \
  >/dev/null 2>&1
t0=$(now)
"$SBOD" grow g --add "${new[@]}" --size "$SIZE_EACH" --wait >/dev/null
t1=$(now)
reshape_s=$(python3 -c "print($t1 - $t0)")

# 2: a rebuild of one member of the grown array.
"$SBOD" fail g "$(member d0)" >/dev/null
t0=$(now)
"$SBOD" replace g "$(member d0)" "$(member r0)" --size "$SIZE_EACH" --wait >/dev/null
t1=$(now)
rebuild_s=$(python3 -c "print($t1 - $t0)")

# 4: the grown array narrowed back, idle.
t0=$(now)
"$SBOD" grow g --remove "${new[@]}" --force --wait >/dev/null
t1=$(now)
narrow_s=$(python3 -c "print($t1 - $t0)")
NARROWVOL=$(nbdinfo --size "$URI")
# 5: a new chunk (twice the one it has), idle.
chunk=$("$SBOD" status g --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["chunk"])')
t0=$(now)
"$SBOD" grow g --chunk $((chunk * 2)) --force --wait >/dev/null
t1=$(now)
rechunk_s=$(python3 -c "print($t1 - $t0)")
member_bytes=$("$SBOD" status g --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["size"]//(s["width"]-s["redundancy"])//s["groups"])')

python3 - "$LEVEL" "$MEMBERS" "$ADD" "$SIZE_EACH" "$VOL" "$NEWVOL" "$reshape_s" "$rebuild_s" \
  "$member_bytes" "$ri_before" "$ri_during" "$sw_before" "$sw_during" "$during_state" "${DRIVES:-files}" \
  "$narrow_s" "$NARROWVOL" "$rechunk_s" "$chunk" <<'EOF'
import sys
(level, n, add, size, vol, newvol, rs, rb, mb, rib, rid, swb, swd, st, kind, ns, nvol, cs, ch) = sys.argv[1:]
cs, ch = float(cs), int(ch)
vol, newvol, rs, rb, mb, ns, nvol = int(vol), int(newvol), float(rs), float(rb), int(mb), float(ns), int(nvol)
print(f"sbod grow: {level} of {n} -> {int(n)+int(add)}, members {size} ({kind})")
print(f"  volume {vol/2**20:.0f} MiB -> {newvol/2**20:.0f} MiB")
print(f"  idle reshape   {rs:7.2f} s   {vol/rs/1e6:8.1f} MB/s of volume moved, {mb/rs/1e6:7.1f} MB/s per member")
print(f"  rebuild of one {rb:7.2f} s   {mb/rb/1e6:8.1f} MB/s per member")
print(f"  reshape/rebuild rate per member: {rb/rs:.2f} (aim >= 0.7)")
print(f"  4K random read QD16 IOPS: {rib} before, {rid} during ({float(rid)/float(rib):.2f}; aim >= 0.5)")
print(f"  1M sequential write QD16 MB/s: {swb} before, {swd} during ({float(swd)/float(swb):.2f}; aim >= 0.5)")
print(f"  (the array was {st} at the end of the jobs run during the reshape)")
print(f"  narrowed back  {ns:7.2f} s   {nvol/ns/1e6:8.1f} MB/s of volume moved, {mb/ns/1e6:7.1f} MB/s per member "
      f"(volume {nvol/2**20:.0f} MiB); narrowing/rebuild per member: {rb/ns:.2f}")
print(f"  chunk {ch >> 10}K -> {ch >> 9}K {cs:7.2f} s   {nvol/cs/1e6:8.1f} MB/s of volume moved, {mb/cs/1e6:7.1f} MB/s per member; "
      f"new chunk/rebuild per member: {rb/cs:.2f}")
EOF

#!/usr/bin/env bash
# Time to full redundancy after one member fails (issue 27), in one run on members of the
# same kind, size and speed:
#   groups:      raid6 in G groups of W plus S hot spares (a spare takes over by itself);
#   declustered: the same G groups and S members' worth of spare space spread over all
#                G*W+S members (`create --declustered`).
# Each array is served, one member failed, and the time until `status` says optimal again
# with no process running: the classic array rebuilt onto a hot spare, the declustered one
# rebuilt into its distributed spare space (docs/ENGINE.md, "Declustered layouts"). The
# bound for the distributed rebuild is (N-1)/(D+1) times the classic one. Then the
# declustered array's copy-back onto a replacement (`sbod replace --wait`) is timed too.
# Then clients on each array (fio's nbd engine, QD16, --runtime seconds each): 4K random
# reads and 1M sequential writes with every member in service (nominal), and again right
# after a second member is failed, while the array rebuilds it (onto the next hot spare, or
# into the spare space), with how fast each array's rebuild moved while they ran.
# While clients are busy a rebuild runs at the array's floor (`sbod set
# --rebuild-min-rate`, 50 MiB/s by default: docs/ENGINE.md). Drives in slow motion
# (`slow=K`) take K times as long for everything, so the bench sets the floor of both
# arrays to 50 MiB/s / K: the same share of a drive's time that the default takes of a
# real one (at slow=8, 6.25 MiB/s). Without that, at slow=8 beside the 1M writer, the
# declustered rebuild (which can keep up a floor the classic one cannot) moved 27-40
# MB/s against the classic's 5-7, and the writer got a third of the groups' rate
# (docs/PERFORMANCE.md, "The rebuild floor").
# Members should be slower than memory so they, not the CPU, set the time: modelled drives
# (docs/LAB.md); with `--drives none` (plain files, on /dev/shm) the rebuilds' rate is
# compared with a plain write of one member's size to the same file system.
# Prints a table; docs/PERFORMANCE.md ("Declustered layouts") records runs with their
# command. Not part of the test suite.
#
#   scripts/bench-declustered.sh                                # 12 x 256M hdd-nearline, 1 group of 8+2, 2 spares
#   scripts/bench-declustered.sh --groups 2 --spares 4          # 24 members
#   scripts/bench-declustered.sh --drives nvme-dc --size-each 1G
#   scripts/bench-declustered.sh --groups 2 --spares 4 --drives none  # tmpfs: CPU-bound
#
# Options (defaults): --groups 1 --width 10 --spares 2 --size-each 256M --runtime 3
#   --drives PROFILE[,OPTS] (hdd-nearline; "none" for plain files; e.g.
#   hdd-nearline,slow=6,span=size) --dir DIR
#   --rebuild-only: only the two rebuilds (no copy-back, no clients)
#   --declustered-only: only the declustered array's distributed rebuild (no classic
#     array, no copy-back, no clients): for A/B runs of builds, whose classic half is the same
#   --clients-only: only the clients (no timed first rebuild, no copy-back): for
#     comparing what clients get while the arrays rebuild, several runs in the time of one
#   --rebuild-min-rate RATE: both arrays' rebuild floor while clients are busy (e.g. 50M;
#     default 50M, divided by K for drives with slow=K)
#   --bitmap-region SIZE: both arrays' write-intent bitmap region (default 128M on
#     modelled drives, the region sbod gives a member of a nearline drive's size, as the
#     lab's demo does: docs/LAB.md; sbod's own choice for plain files). A 1 GiB member
#     gets 1 MiB regions, and on a drive in slow motion each region's first write (a FUA
#     write a seek away) and the sweeper's flush and clear each second take K times the
#     share of the drive they take of a real one: the 1M writer then measured the bitmap
#     (docs/PERFORMANCE.md, "The write-intent bitmap ahead of a writer").
# Environment: SBOD=path/to/sbod skips the build; SBOD_BENCH_LOGS=DIR keeps the servers'
# logs there (with SBOD_DRIVE_STATS=1, what each modelled drive did and its media time).
set -euo pipefail
cd "$(dirname "$0")/.."
GROUPS_=1
WIDTH=10
SPARES=2
SIZE_EACH=256M
DRIVES=hdd-nearline
DIR=
RUNTIME=3
REBUILD_ONLY=0
CLIENTS_ONLY=0
DECL_ONLY=0
MIN_RATE=
REGION=
while [ $# -gt 0 ]; do
  case "$1" in
    --groups) GROUPS_=$2; shift 2 ;;
    --width) WIDTH=$2; shift 2 ;;
    --spares) SPARES=$2; shift 2 ;;
    --size-each) SIZE_EACH=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --rebuild-only) REBUILD_ONLY=1; shift ;;
    --clients-only) CLIENTS_ONLY=1; shift ;;
    --declustered-only) DECL_ONLY=1; REBUILD_ONLY=1; shift ;;
    --rebuild-min-rate) MIN_RATE=$2; shift 2 ;;
    --bitmap-region) REGION=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$MIN_RATE" ]; then
  # 50 MiB/s (the arrays' default floor) over the drives' slow motion, if any.
  slow=$(sed -n 's/.*slow=\([0-9]*\).*/\1/p' <<<"$DRIVES")
  MIN_RATE=$(((50 << 20) / ${slow:-1}))
fi
if [ -z "$REGION" ] && [ "$DRIVES" != none ]; then REGION=128M; fi
# The owner block's heartbeat (every second of the wall's, a read and a write of each
# member: docs/RELIABILITY.md) slowed with the drives, as in scripts/bench-raid.sh: at
# slow=K a second of the wall is 1/K of the drives', and an unscaled heartbeat costs the
# slowed drives K times its real share. Set SBOD_HEARTBEAT_MS to override.
if [[ ",$DRIVES," =~ ,slow=([0-9]+), ]] && [ -z "${SBOD_HEARTBEAT_MS:-}" ]; then
  export SBOD_HEARTBEAT_MS=$((1000 * BASH_REMATCH[1]))
fi
export PATH="$HOME/.cargo/bin:$PATH"
if [ -z "${SBOD:-}" ]; then
  cargo build --release -q -p sbod
  SBOD=$PWD/target/release/sbod
fi
source scripts/deps.sh
if [ -z "$DIR" ]; then
  if [ -w /dev/shm ]; then DIR=/dev/shm; else DIR=$PWD; fi
fi
WORK=$(mktemp -d "$DIR/.sbod-bench-decl.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
SERVER=
NAME=
cleanup() {
  if [ -n "$SERVER" ]; then
    "$SBOD" stop "$NAME" >/dev/null 2>&1 || kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  if [ -n "${SBOD_BENCH_LOGS:-}" ]; then
    mkdir -p "$SBOD_BENCH_LOGS" && cp "$WORK"/*.log "$SBOD_BENCH_LOGS"/ 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
N=$((GROUPS_ * WIDTH + SPARES))
member() { # name -> member path (modelled drive or file)
  if [ "$DRIVES" != none ]; then echo "model:$DRIVES:$WORK/$1.img"; else echo "$WORK/$1.img"; fi
}
now() { date +%s.%N; }
# CPU seconds the server has used (user + system), to tell a drive-bound rebuild from a
# CPU-bound one (2 cores: near 2 s a second is saturated).
cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$SERVER/stat"; }
serve() { # name
  NAME=$1
  local sock=$WORK/$1.sock
  "$SBOD" serve "$1" --nbd "unix:$sock" >/dev/null 2>"$WORK/$1.log" &
  SERVER=$!
  for _ in $(seq 1 600); do
    if nbdinfo --size "nbd+unix:///?socket=$sock" >/dev/null 2>&1; then
      "$SBOD" set "$1" --rebuild-min-rate "$MIN_RATE" >/dev/null
      return
    fi
    sleep 0.1
  done
  echo "sbod serve did not come up" >&2; cat "$WORK/$1.log" >&2; exit 1
}
unserve() {
  "$SBOD" stop "$NAME" >/dev/null; wait "$SERVER" 2>/dev/null || true; SERVER=
}
# Optimal, and no process running (a declustered array is optimal as its distributed
# rebuild commits, a moment before the process ends).
settled() {
  "$SBOD" status "$1" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["state"] == "optimal" and not s.get("process"))'
}
# "SECONDS BYTES": the time now and how far the running rebuild has got on its member
# (the member's size once none runs).
progress() {
  "$SBOD" status "$1" --json | python3 -c '
import json,sys,time
s=json.load(sys.stdin); p=s.get("process")
print(time.time(), p["done"] if p else s["members"][1]["size"])'
}
# The rebuild's member bytes a second between two `progress` readings, in MB/s.
rate() { python3 -c "import sys; a=sys.argv[1].split(); b=sys.argv[2].split(); print('%.1f' % ((int(b[1])-int(a[1]))/(float(b[0])-float(a[0]))/1e6))" "$1" "$2"; }
wait_optimal() { python3 scripts/wait-optimal.py "$SBOD" "$1" --settled; }
fio_job() { # array rw bs -> "iops mbps"
  local uri="nbd+unix:///?socket=$WORK/$1.sock"
  fio --name=j --ioengine=nbd --uri="$uri" --rw="$2" --bs="$3" --iodepth=16 --direct=1 \
    --time_based --runtime="$RUNTIME" --size="$(nbdinfo --size "$uri")" --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); j=d["jobs"][0]
x=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f %.1f" % (x["iops"], x["bw_bytes"]/1e6))'
}
# -> "rr_nominal sw_nominal rr_during sw_during rebuilding_at_end rebuild_rate_during_rr
#     rebuild_rate_during_sw"
clients() { # array victim
  local rrn swn rrd swd p0 p1 p2
  read -r rrn _ <<<"$(fio_job "$1" randread 4k)"
  read -r _ swn <<<"$(fio_job "$1" write 1M)"
  "$SBOD" fail "$1" "$(member "$2")" >/dev/null
  p0=$(progress "$1")
  read -r rrd _ <<<"$(fio_job "$1" randread 4k)"
  p1=$(progress "$1")
  read -r _ swd <<<"$(fio_job "$1" write 1M)"
  p2=$(progress "$1")
  echo "$rrn $swn $rrd $swd $(settled "$1") $(rate "$p0" "$p1") $(rate "$p1" "$p2")"
  wait_optimal "$1"
}

# The classic array: G groups of W and S hot spares.
classic_s=0; classic_cpu=0; member_bytes=; classic_clients="0 0 0 0 True 0 0"
if [ "$DECL_ONLY" = 0 ]; then
m=(); for i in $(seq 0 $((N - 1))); do m+=("$(member c$i)"); done
"$SBOD" create classic --level raid6 --groups "$GROUPS_" --spares "$SPARES" \
  --size-each "$SIZE_EACH" ${REGION:+--bitmap-region "$REGION"} --assume-clean "${m[@]}" >/dev/null
serve classic
wait_optimal classic
t0=$(now); c0=$(cpu)
[ "$CLIENTS_ONLY" = 1 ] || "$SBOD" fail classic "$(member c0)" >/dev/null
sleep 0.05
wait_optimal classic
t1=$(now); c1=$(cpu)
classic_s=$(python3 -c "print($t1 - $t0)")
classic_cpu=$(python3 -c "print($c1 - $c0)")
member_bytes=$("$SBOD" status classic --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["members"][1]["size"])')
[ "$REBUILD_ONLY" = 1 ] || classic_clients=$(clients classic c1)
unserve
# The classic array's member files go before the declustered array starts: on this
# machine's tmpfs, 3 GB of other data there halved the next array's 1M writes (129 ->
# 66 MB/s for the same raid6 groups, 115 -> 56 for the declustered layout), so an
# array run second beside the first one's files measured the machine, not the layout
# (docs/PERFORMANCE.md, "The bench's order").
rm -f "$WORK"/c*.img
fi

# The declustered array on as many members of the same kind.
m=(); for i in $(seq 0 $((N - 1))); do m+=("$(member d$i)"); done
"$SBOD" create decl --level raid6 --groups "$GROUPS_" --spares "$SPARES" --declustered \
  --size-each "$SIZE_EACH" ${REGION:+--bitmap-region "$REGION"} --assume-clean "${m[@]}" >/dev/null
serve decl
wait_optimal decl
t0=$(now); c0=$(cpu)
[ "$CLIENTS_ONLY" = 1 ] || "$SBOD" fail decl "$(member d0)" >/dev/null
sleep 0.05
wait_optimal decl
t1=$(now); c1=$(cpu)
decl_s=$(python3 -c "print($t1 - $t0)")
[ -n "$member_bytes" ] || member_bytes=$("$SBOD" status decl --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["members"][1]["size"])')
decl_cpu=$(python3 -c "print($c1 - $c0)")
copy_s=0
decl_clients="0 0 0 0 True 0 0"
if [ "$REBUILD_ONLY" = 0 ]; then
  # The copy-back onto a replacement (the slot's chunks copied out of the spare space).
  if [ "$CLIENTS_ONLY" = 0 ]; then
    t0=$(now)
    "$SBOD" replace decl "$(member d0)" "$(member r0)" --size "$SIZE_EACH" --wait >/dev/null
    wait_optimal decl
    t1=$(now)
    copy_s=$(python3 -c "print($t1 - $t0)")
  fi
  decl_clients=$(clients decl d1)
fi
unserve

# A plain write of one member's size to the same file system (the members' raw rate,
# for plain files; a modelled drive's own rate is in docs/LAB.md).
raw_s=0
if [ "$DRIVES" = none ]; then
  t0=$(now)
  dd if=/dev/zero of="$WORK/raw.img" bs=1M count="$((member_bytes >> 20))" conv=fdatasync status=none
  t1=$(now)
  raw_s=$(python3 -c "print($t1 - $t0)")
  rm -f "$WORK/raw.img"
fi

CLIENTS_ONLY=$CLIENTS_ONLY MIN_RATE=$MIN_RATE REGION=$REGION python3 - "$N" "$GROUPS_" "$WIDTH" "$SPARES" "$SIZE_EACH" "$DRIVES" "$member_bytes" \
  "$classic_s" "$decl_s" "$copy_s" "$raw_s" "$classic_clients" "$decl_clients" \
  "$classic_cpu" "$decl_cpu" <<'EOF'
import os, sys
n, g, w, s, size, drives, mb, cs, ds, cps, raw, cc, dc, ccpu, dcpu = sys.argv[1:]
n, g, w, s, mb = int(n), int(g), int(w), int(s), int(mb)
cs, ds, cps, raw = float(cs), float(ds), float(cps), float(raw)
d = w - 2
bound = (n - 1) / (d + 1)
clients_only = os.environ.get("CLIENTS_ONLY") == "1"
print(f"{'clients' if clients_only else 'time to full redundancy after one failure'}: {n} members of {size} ({drives})")
if cs == 0 and not clients_only:
  print(f"  declustered raid6 {g} x {w}, {s} spares' space {ds:8.2f} s  {mb/ds/1e6:8.1f} MB/s of the member")
  print(f"  server CPU during the rebuild: {float(dcpu)/ds:.2f} cores (no classic array: --declustered-only)")
elif not clients_only:
  print(f"  raid6 {g} x {w} + {s} hot spares             {cs:8.2f} s  {mb/cs/1e6:8.1f} MB/s of the member")
  print(f"  the same, declustered (distributed rebuild) {ds:8.2f} s  {mb/ds/1e6:8.1f} MB/s of the member")
  print(f"  server CPU during the rebuild: classic {float(ccpu)/cs:.2f}, declustered {float(dcpu)/ds:.2f} cores")
  print(f"  speed-up {cs/ds:.2f} = {cs/ds/bound:.2f} of the bound (N-1)/(D+1) = {bound:.2f}")
if cps > 0:
    print(f"  declustered copy-back onto a replacement    {cps:8.2f} s  {mb/cps/1e6:8.1f} MB/s")
if raw > 0:
    print(f"  plain write of one member's size            {raw:8.2f} s  {mb/raw/1e6:8.1f} MB/s")
    classic = f"classic {raw/cs:.2f}, " if cs > 0 else ""
    print(f"  rebuild rate / raw write rate: {classic}distributed {raw/ds:.2f}")
c, dl = cc.split(), dc.split()
if float(c[0]) == 0:
    sys.exit(0)
print("  clients (QD16)                 raid6 groups   declustered   declustered/groups")
for name, i in (("4K rand read IOPS, nominal", 0), ("1M seq write MB/s, nominal", 1),
                ("4K rand read IOPS, rebuilding", 2), ("1M seq write MB/s, rebuilding", 3)):
    print(f"  {name:30} {float(c[i]):12.1f} {float(dl[i]):13.1f} {float(dl[i])/float(c[i]):12.2f}")
print(f"  (still rebuilding when the jobs ended: groups {c[4] != 'True'}, declustered {dl[4] != 'True'})")
floor = os.environ["MIN_RATE"]
floor = f"{int(floor) / 2**20:.2f} MiB/s" if floor.isdigit() else floor
print(f"  rebuild MB/s while the clients ran (floor {floor} while busy; bitmap region {os.environ['REGION'] or 'sbod default'}):")
print(f"    during the 4K reads:  groups {float(c[5]):6.1f}, declustered {float(dl[5]):6.1f}")
print(f"    during the 1M writes: groups {float(c[6]):6.1f}, declustered {float(dl[6]):6.1f}")
EOF

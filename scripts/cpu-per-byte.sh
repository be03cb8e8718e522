#!/usr/bin/env bash
# The server's CPU per byte of 1 MiB sequential writes to a parity array on members in
# memory (issue 31, docs/PERFORMANCE.md "CPU per byte"): a raid6 of 8 tmpfs files (64 KiB
# chunks, checksums on) served over a Unix socket, filled once, then written N times over
# by fio (nbd engine, QD16); the server's CPU (user + system, /proc/PID/stat) per GB, its
# member reads and writes per request (/proc/PID/io's read and write system calls), and MB/s. Builds given
# with --sbod and --sbod-b take turns, round by round (ratios in one run).
#
#   scripts/cpu-per-byte.sh --sbod NEW [--sbod-b OLD] [--rounds 3] [--level raid6]
#                           [--members 8] [--size-each 256M] [--loops 3] [--perf FILE]
#
# --perf FILE records the last round's first build with `perf record --call-graph dwarf`.
# Member files go in /dev/shm and are removed; installs fio and the rest (scripts/deps.sh).
set -euo pipefail
SBOD=; SBOD_B=; ROUNDS=3; LEVEL=raid6; MEMBERS=8; SIZE=256M; LOOPS=3; PERF=
while [ $# -gt 0 ]; do
  case "$1" in
    --sbod) SBOD=$2; shift 2 ;;
    --sbod-b) SBOD_B=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --level) LEVEL=$2; shift 2 ;;
    --members) MEMBERS=$2; shift 2 ;;
    --size-each) SIZE=$2; shift 2 ;;
    --loops) LOOPS=$2; shift 2 ;;
    --perf) PERF=$2; shift 2 ;;
    *) echo "cpu-per-byte: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$SBOD" ] || { echo "usage: $0 --sbod BIN [--sbod-b BIN] ..." >&2; exit 2; }
SBOD=$(realpath "$SBOD"); [ -z "$SBOD_B" ] || SBOD_B=$(realpath "$SBOD_B")
cd "$(dirname "$0")/.."
source scripts/deps.sh
W=$(mktemp -d /dev/shm/sbod-cpu-per-byte.XXXXXX)
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
bytes=$(numfmt --from=iec "$SIZE")
one() { # BIN LABEL PERF
  local bin=$1 label=$2 perf=$3 ms=() ppid= r0 r1 c0 c1 u0 u1
  rm -rf "$W"/*
  export SBOD_STATE_DIR=$W/state
  for i in $(seq 0 $((MEMBERS - 1))); do
    dd if=/dev/zero of="$W/m$i.img" bs=1M count=$((bytes >> 20)) status=none
    ms+=("$W/m$i.img")
  done
  # Zeroed members: no initial sync (its reads would be counted as the writes').
  "$bin" create cpb --level "$LEVEL" --chunk 64K --integrity crc32c --assume-clean --force \
    "${ms[@]}" >/dev/null
  "$bin" serve cpb --nbd "unix:$W/s.sock" 2>"$W/serve.log" &
  pid=$!
  for _ in $(seq 100); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
  # The fill is one pass over up to 1 GiB of the volume.
  local vol m
  case "$LEVEL" in raid5) m=1 ;; raid6) m=2 ;; ec:*) m=${LEVEL##*+} ;; *) m=0 ;; esac
  # Less than the volume (the members keep their superblocks and tags too).
  vol=$(( (bytes - (16 << 20)) * (MEMBERS - m) / (1 << 20) ))
  local size=$(( vol < 1024 ? vol : 1024 ))M
  run() {
    fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --rw=write --bs=1M \
      --iodepth=16 --size="$size" --loops="$1" --output-format=json 2>/dev/null |
      python3 -c 'import json,sys;t=sys.stdin.read();d=json.loads(t[t.index("{"):]);print("%.0f"%(d["jobs"][0]["write"]["bw_bytes"]/1e6))'
  }
  run 1 >/dev/null
  io() { awk '/^syscr/{r=$2}/^syscw/{w=$2}END{print r, w}' "/proc/$pid/io"; }
  cpu() { awk '{print $14, $15}' "/proc/$pid/stat"; }
  r0=$(io); c0=$(cpu)
  if [ -n "$perf" ]; then
    perf record -F 1000 --call-graph dwarf,16384 -p "$pid" -o "$perf" 2>/dev/null &
    ppid=$!
  fi
  local mbs
  mbs=$(run "$LOOPS")
  r1=$(io); c1=$(cpu)
  [ -z "$ppid" ] || { kill -INT "$ppid"; wait "$ppid" || true; }
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  python3 - "$label" "$mbs" "$r0" "$r1" "$c0" "$c1" "${size%M}" "$LOOPS" <<'PY'
import os, sys
label, mbs, r0, r1, c0, c1, size, loops = sys.argv[1:]
hz = os.sysconf("SC_CLK_TCK")
(ra, wa), (rb, wb) = map(int, r0.split()), map(int, r1.split())
(ua, sa), (ub, sb) = map(int, c0.split()), map(int, c1.split())
reqs = int(size) * int(loops)
gb = reqs * 2**20 / 1e9
user, system = (ub - ua) / hz, (sb - sa) / hz
print(f"| {label} | {mbs} | {gb / (user + system):.2f} | {gb / max(user, 1e-9):.2f} | "
      f"{(rb - ra) / reqs:.2f} | {(wb - wa) / reqs:.2f} |")
PY
}
echo "# cpu-per-byte: $LEVEL of $MEMBERS x $SIZE on /dev/shm, 1M writes QD16, $LOOPS passes; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%MZ)"
echo "| build | MB/s | GB per CPU-s (user+sys) | user only | member reads / req | member writes / req |"
echo "|---|---:|---:|---:|---:|---:|"
for r in $(seq "$ROUNDS"); do
  p=; [ "$r" = "$ROUNDS" ] && p=$PERF
  if [ $((r % 2)) -eq 1 ] || [ -z "$SBOD_B" ]; then
    one "$SBOD" sbod "$p"; [ -z "$SBOD_B" ] || one "$SBOD_B" sbod-b ""
  else
    one "$SBOD_B" sbod-b ""; one "$SBOD" sbod "$p"
  fi
done

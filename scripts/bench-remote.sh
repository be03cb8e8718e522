#!/usr/bin/env bash
# The cost of the network hop: the same six members as one raid6, served by `sbod serve`
# (1) as local files and (2) as remote members, each exported by `sbod export` over TCP on
# loopback (nbd://127.0.0.1:PORT/NAME), driven by the same fio jobs through the head's NBD
# socket. Local and remote take turns in every round, on the same files, so both see the
# same machine; the table gives the mean of the rounds and remote/local.
#
#   scripts/bench-remote.sh [--runtime SECONDS] [--size SIZE] [--rounds N] [--dir DIR] [--lab]
#
# Defaults: 10 s per job, 512M members in /dev/shm, 3 rounds. --lab also runs the storage
# lab (`sbod bench`, BASELINE and NOMINAL) on the remote array. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=10
SIZE=512M
ROUNDS=3
DIR=/dev/shm
LAB=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --lab) LAB=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
cargo build --release -q -p sbod
SBOD=$PWD/target/release/sbod

WORK=$(mktemp -d "$DIR/sbod-remote.XXXXXX")
export SBOD_STATE_DIR=$WORK/state
NODE_STATE=$WORK/node-state
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}
cleanup() { stop_all; rm -rf "$WORK"; }
trap cleanup EXIT

MEMBERS=()
for i in 0 1 2 3 4 5; do
  truncate -s "$SIZE" "$WORK/m$i.img"
  MEMBERS+=("$WORK/m$i.img")
done
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URIS=()
for i in 0 1 2 3 4 5; do URIS+=("nbd://127.0.0.1:$PORT/m$i.img"); done

wait_nbd() {
  for _ in $(seq 200); do nbdinfo --size "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "$1 did not come up" >&2; exit 1
}

# Bring up the array over local files or remote members; its NBD socket is $WORK/head.sock.
up() {
  if [ "$1" = remote ]; then
    SBOD_STATE_DIR=$NODE_STATE $SBOD export "${MEMBERS[@]}" --nbd "tcp:127.0.0.1:$PORT" 2>"$WORK/export.log" &
    PIDS+=($!)
    wait_nbd "${URIS[0]}"
    $SBOD create vol --level raid6 --force --assume-clean --domains a,b,c,d,e,f "${URIS[@]}" >/dev/null
  else
    $SBOD create vol --level raid6 --force --assume-clean "${MEMBERS[@]}" >/dev/null
  fi
  $SBOD serve vol --nbd "unix:$WORK/head.sock" 2>"$WORK/head-$1.log" &
  PIDS+=($!)
  wait_nbd "nbd+unix:///?socket=$WORK/head.sock"
}

down() {
  $SBOD stop vol >/dev/null
  $SBOD forget vol >/dev/null
  stop_all
}

JOBS=(
  "randread-4K-qd32:--rw=randread --bs=4k --iodepth=32"
  "randwrite-4K-qd32:--rw=randwrite --bs=4k --iodepth=32"
  "randread-4K-qd1:--rw=randread --bs=4k --iodepth=1"
  "seqread-1M:--rw=read --bs=1M --iodepth=8"
  "seqwrite-1M:--rw=write --bs=1M --iodepth=8"
)
RESULTS=$WORK/results.jsonl
for round in $(seq "$ROUNDS"); do
  for where in local remote; do
    up "$where"
    SIZE_BYTES=$(nbdinfo --size "nbd+unix:///?socket=$WORK/head.sock")
    for job in "${JOBS[@]}"; do
      name=${job%%:*}; opts=${job#*:}
      # shellcheck disable=SC2086
      fio --name="$name" --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/head.sock" $opts \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --size="$SIZE_BYTES" \
        --output-format=json >"$WORK/out.json"
      python3 - "$WORK/out.json" "$name" "$where" "$round" >>"$RESULTS" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):])
j = d["jobs"][0]
io = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print(json.dumps({"job": sys.argv[2], "where": sys.argv[3], "round": int(sys.argv[4]),
                  "iops": io["iops"], "mbps": io["bw_bytes"] / 1e6,
                  "lat_us": io["lat_ns"]["mean"] / 1000}))
PY
    done
    if [ "$where" = remote ] && [ "$LAB" = 1 ] && [ "$round" = 1 ]; then
      $SBOD stop vol >/dev/null
      for p in "${PIDS[@]:1}"; do wait "$p" 2>/dev/null || true; done
      $SBOD bench vol --destructive --phases baseline,nominal --runtime "$RUNTIME" --ramp 1 \
        --reps 1 --precondition none --workloads randread-4k,randwrite-4k,seqread-1m,seqwrite-1m \
        --out "$WORK/lab"
      $SBOD serve vol --nbd "unix:$WORK/head.sock" 2>>"$WORK/head-remote.log" &
      PIDS+=($!)
      wait_nbd "nbd+unix:///?socket=$WORK/head.sock"
    fi
    down
  done
done
echo "raid6 over 6 x $SIZE members in $DIR; $ROUNDS rounds of $RUNTIME s per job; mean over rounds"
python3 - "$RESULTS" <<'PY'
import json, sys, collections, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["job"], r["where"])].append(r)
jobs = list(dict.fromkeys(r["job"] for r in rows))
print("| job | local IOPS | remote IOPS | local MB/s | remote MB/s | local lat us | remote lat us | remote/local |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for j in jobs:
    m = lambda w, k: statistics.mean(r[k] for r in by[(j, w)])
    print(f"| {j} | {m('local','iops'):,.0f} | {m('remote','iops'):,.0f} | {m('local','mbps'):,.1f} | "
          f"{m('remote','mbps'):,.1f} | {m('local','lat_us'):,.0f} | {m('remote','lat_us'):,.0f} | "
          f"{m('remote','iops')/m('local','iops'):.2f} |")
PY

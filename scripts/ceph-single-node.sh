#!/usr/bin/env bash
# A single-node Ceph cluster as ordinary processes under one directory, for sbod's lab and
# tests: one monitor, one manager and N bluestore OSDs on files, bound to loopback only,
# without systemd or cephadm. Debian's own packages (ceph-mon ceph-mgr ceph-osd ceph-common)
# are installed with apt-get when missing.
#
#   scripts/ceph-single-node.sh up DIR [--osds N] [--osd-size SIZE] [--files F1,F2,...]
#       Bring the cluster up (about 30 s) and wait until HEALTH_OK. Idempotent: a cluster
#       already up in DIR is left as it is; a stale DIR (its daemons gone) is made anew.
#       --files puts the OSDs on these existing files (one OSD each, their size kept):
#       the lab's side-by-side runs sbod and Ceph on the same member files.
#   scripts/ceph-single-node.sh pool DIR NAME rep:SIZE[:MIN_SIZE] | ec:K+M [PGS]
#       Create an RBD pool (failure domain: OSD). An EC pool gets a replicated
#       NAME-meta pool for the image headers: address images as rbd:NAME-meta/IMAGE
#       with data in NAME (see `image`).
#   scripts/ceph-single-node.sh image DIR POOL IMAGE SIZE
#       Create an RBD image (in an EC pool: header in POOL-meta, data in POOL).
#   scripts/ceph-single-node.sh stop-osd DIR ID | start-osd DIR ID
#       Stop (SIGTERM, then wait) or start one OSD daemon: sbod bench's --ceph-osd-stop and
#       --ceph-osd-start for DEVICE DOWN and DEVICE REBUILD.
#   scripts/ceph-single-node.sh env DIR
#       Print `export CEPH_CONF=DIR/ceph.conf` (ceph, rbd, fio's rbd engine, qemu-img).
#   scripts/ceph-single-node.sh down DIR
#       Stop every daemon this script started in DIR and remove DIR.
set -euo pipefail

die() { echo "ceph-single-node: $*" >&2; exit 1; }
say() { echo "ceph-single-node: $*" >&2; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 up|down|pool|image|stop-osd|start-osd|env DIR ..."
shift 2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
conf="$dir/ceph.conf"
marker="$dir/.sbod-ceph-single-node"

install_ceph() {
  local need=()
  command -v ceph-mon >/dev/null 2>&1 || need+=(ceph-mon)
  command -v ceph-mgr >/dev/null 2>&1 || need+=(ceph-mgr)
  command -v ceph-osd >/dev/null 2>&1 || need+=(ceph-osd)
  command -v ceph >/dev/null 2>&1 || need+=(ceph-common)
  command -v rbd >/dev/null 2>&1 || need+=(ceph-common)
  if [ ${#need[@]} -gt 0 ]; then
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    say "installing ${need[*]} (apt-get)"
    $sudo apt-get update -qq >&2 || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
      || die "could not install ${need[*]}: install Debian's ceph-mon ceph-mgr ceph-osd ceph-common"
  fi
  if command -v fio >/dev/null 2>&1 && ! fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*rbd'; then
    say "warning: this fio has no rbd engine (Debian's fio has it with librbd1 installed)"
  fi
}

c() { ceph -c "$conf" --connect-timeout 10 "$@"; }

# pid of a daemon (mon.a, mgr.x, osd.N) if it runs, from its pid file, checked against its
# command line so a reused pid is never touched.
daemon_pid() {
  local f="$dir/run/$1.pid" pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$conf" || return 1
  echo "$pid"
}

stop_daemon() {
  local pid i
  pid=$(daemon_pid "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}

all_daemons() {
  local f
  for f in "$dir"/run/*.pid; do
    [ -e "$f" ] || continue
    basename "$f" .pid
  done
}

down() {
  [ -d "$dir" ] || return 0
  if [ ! -e "$marker" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir was not made by this script (no $marker): not removing it"
  fi
  local d
  # OSDs first, then the manager, the monitor last.
  for d in $(all_daemons | grep '^osd\.' || true); do stop_daemon "$d" & done
  wait
  for d in $(all_daemons | grep -v '^osd\.' | grep -v '^mon\.' || true); do stop_daemon "$d"; done
  for d in $(all_daemons | grep '^mon\.' || true); do stop_daemon "$d"; done
  rm -rf "$dir"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

healthy() {
  local h
  h=$(c health 2>/dev/null) || return 1
  [ "${h%% *}" = HEALTH_OK ] || return 1
  # every PG active+clean
  c pg stat 2>/dev/null | grep -Eq '^[0-9]+ pgs: [0-9]+ active\+clean;|^0 pgs' || return 1
}

wait_healthy() {
  local secs=$1 t=0
  while ! healthy; do
    t=$((t + 1))
    if [ $t -gt $((secs * 2)) ]; then
      c status >&2 || true
      die "the cluster in $dir is not HEALTH_OK with every PG active+clean after ${secs} s (logs: $dir/log)"
    fi
    sleep 0.5
  done
}

up() {
  local osds=3 size=1G files=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --osds) osds=$2; shift 2 ;;
      --osd-size) size=$2; shift 2 ;;
      --files) files=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  local -a filelist=()
  if [ -n "$files" ]; then
    IFS=, read -r -a filelist <<<"$files"
    osds=${#filelist[@]}
    local f
    for f in "${filelist[@]}"; do
      [ -f "$f" ] || die "--files: $f is not a file"
    done
  fi
  install_ceph
  if [ -e "$marker" ] && daemon_pid mon.a >/dev/null && healthy; then
    say "the cluster in $dir is already up"
    echo "export CEPH_CONF=$conf"
    return 0
  fi
  down
  local bytes
  bytes=$(numfmt --from=iec "${size%B}") || die "--osd-size $size: not a size"
  mkdir -p "$dir"/{run,log,crash,mon.a,mgr.x}
  touch "$marker"
  local fsid port t0
  t0=$(date +%s.%N)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  port=$(free_port)
  local pgdefault=1
  [ "$osds" -ge 3 ] && pgdefault=3 || pgdefault=$osds
  cat >"$conf" <<EOF
# Written by scripts/ceph-single-node.sh: a single-node lab cluster, loopback only.
[global]
fsid = $fsid
mon_host = v2:127.0.0.1:$port
mon_initial_members = a
public_network = 127.0.0.0/8
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
run_dir = $dir/run
pid_file = $dir/run/\$name.pid
admin_socket = $dir/run/\$name.asok
log_file = $dir/log/\$name.log
crash_dir = $dir/crash
keyring = /dev/null
osd_pool_default_size = $pgdefault
osd_pool_default_min_size = 1
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_delete = true
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
mon_max_pg_per_osd = 1000
auth_allow_insecure_global_id_reclaim = false
mgr_initial_modules = iostat
debug_ms = 0
debug_osd = 0
debug_bluestore = 0
debug_bluefs = 0
debug_rocksdb = 0
debug_mon = 0
debug_mgr = 0
debug_paxos = 0
[mon]
mon_data = $dir/\$name
[mgr]
mgr_data = $dir/\$name
[osd]
osd_data = $dir/\$name
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = $bytes
bluestore_fsck_on_mount = false
osd_memory_target = 939524096
osd_memory_cache_min = 134217728
bluestore_cache_autotune = true
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 1
osd_recovery_sleep = 0
osd_recovery_sleep_hdd = 0
osd_max_backfills = 4
osd_scrub_begin_hour = 0
osd_scrub_end_hour = 0
osd_scrub_during_recovery = false
EOF
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >"$dir/log/mkfs-mon.log" 2>&1 \
    || { cat "$dir/log/mkfs-mon.log" >&2; die "ceph-mon --mkfs failed"; }
  ceph-mon -c "$conf" -i a || die "ceph-mon did not start (log: $dir/log/mon.a.log)"
  ceph-mgr -c "$conf" -i x || die "ceph-mgr did not start (log: $dir/log/mgr.x.log)"
  c config set mgr mgr/devicehealth/enable_monitoring false >/dev/null 2>&1 || true
  local i id uuid pids=()
  for i in $(seq 0 $((osds - 1))); do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(c osd new "$uuid") || die "ceph osd new failed (log: $dir/log/mon.a.log)"
    mkdir -p "$dir/osd.$id"
    local extra=()
    if [ ${#filelist[@]} -gt 0 ]; then
      # The member file itself is the OSD's device (bluestore keeps a file's size).
      extra=(--bluestore-block-path "$(readlink -f "${filelist[$i]}")")
      echo "$(readlink -f "${filelist[$i]}")" >"$dir/osd.$id.file"
    fi
    (
      ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" "${extra[@]}" >"$dir/log/mkfs-osd.$id.log" 2>&1 \
        || { cat "$dir/log/mkfs-osd.$id.log" >&2; exit 1; }
      ceph-osd -c "$conf" -i "$id" "${extra[@]}" >>"$dir/log/mkfs-osd.$id.log" 2>&1
    ) &
    pids+=($!)
    [ ${#extra[@]} -gt 0 ] && printf '%s\n' "${extra[@]}" >"$dir/osd.$id.args" || : >"$dir/osd.$id.args"
  done
  for p in "${pids[@]}"; do wait "$p" || die "an OSD did not start (logs: $dir/log)"; done
  local n=0
  while [ "$(c osd stat -f json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("num_up_osds",0))' 2>/dev/null || echo 0)" != "$osds" ]; do
    n=$((n + 1)); [ $n -lt 240 ] || die "only some of $osds OSDs came up after 120 s (logs: $dir/log)"
    sleep 0.5
  done
  wait_healthy 120
  say "up in $(python3 -c "import time; print(round(time.time()-$t0,1))") s: 1 monitor (127.0.0.1:$port), 1 manager, $osds OSDs in $dir"
  echo "export CEPH_CONF=$conf"
}

pool() {
  local name=${1:-} spec=${2:-} pgs=${3:-32}
  [ -n "$name" ] && [ -n "$spec" ] || die "usage: pool DIR NAME rep:SIZE[:MIN] | ec:K+M [PGS]"
  case "$spec" in
    rep:*)
      local s=${spec#rep:} size min
      size=${s%%:*}
      min=$([ "$s" != "$size" ] && echo "${s#*:}" || echo $(((size + 1) / 2)))
      c osd pool create "$name" "$pgs" "$pgs" replicated >/dev/null
      c osd pool set "$name" size "$size" --yes-i-really-mean-it >/dev/null
      c osd pool set "$name" min_size "$min" >/dev/null
      c osd pool application enable "$name" rbd >/dev/null
      ;;
    ec:*)
      local km=${spec#ec:} k m
      k=${km%+*}
      m=${km#*+}
      c osd erasure-code-profile set "sbod-$k-$m" k="$k" m="$m" crush-failure-domain=osd --force >/dev/null
      c osd pool create "$name" "$pgs" "$pgs" erasure "sbod-$k-$m" >/dev/null
      c osd pool set "$name" allow_ec_overwrites true >/dev/null
      c osd pool application enable "$name" rbd >/dev/null
      c osd pool create "$name-meta" 8 8 replicated >/dev/null
      c osd pool application enable "$name-meta" rbd >/dev/null
      ;;
    *) die "pool: $spec: use rep:SIZE[:MIN_SIZE] or ec:K+M" ;;
  esac
  wait_healthy 120
}

image() {
  local p=${1:-} img=${2:-} size=${3:-}
  [ -n "$p" ] && [ -n "$img" ] && [ -n "$size" ] || die "usage: image DIR POOL IMAGE SIZE"
  if c osd pool ls | grep -qx "$p-meta"; then
    rbd -c "$conf" create --size "$size" --data-pool "$p" "$p-meta/$img"
    echo "rbd:$p-meta/$img"
  else
    rbd -c "$conf" create --size "$size" "$p/$img"
    echo "rbd:$p/$img"
  fi
}

case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  pool) pool "$@" ;;
  image) image "$@" ;;
  env) echo "export CEPH_CONF=$conf" ;;
  stop-osd) [ -n "${1:-}" ] || die "stop-osd DIR ID"; stop_daemon "osd.$1" ;;
  start-osd)
    [ -n "${1:-}" ] || die "start-osd DIR ID"
    daemon_pid "osd.$1" >/dev/null && exit 0
    mapfile -t extra <"$dir/osd.$1.args"
    ceph-osd -c "$conf" -i "$1" "${extra[@]}" >>"$dir/log/mkfs-osd.$1.log" 2>&1
    ;;
  *) die "unknown command $cmd: up, down, pool, image, stop-osd, start-osd, env" ;;
esac

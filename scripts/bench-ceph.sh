#!/usr/bin/env bash
# sbod beside Ceph on the same member files, one after the other, in one run and one report.
#
#   scripts/bench-ceph.sh [--members 6] [--size-each 1G] [--working-set 256M]
#                         [--runtime 1] [--reps 1] [--workloads randread-4k,randwrite-4k]
#                         [--qd-sweep 1,16,64] [--out bench-ceph] [--long]
#
# 1. BASELINE: the member files alone (sbod bench's BASELINE, once).
# 2. sbod ec:4+2 (6 members) and raid10 with 3 copies (2 mirror sets of 3: "raid1 x3"),
#    each through NOMINAL, DEVICE DOWN and DEVICE REBUILD (sbod bench NAME).
# 3. The same files, wiped, become the 6 bluestore OSDs of a single-node Ceph
#    (scripts/ceph-single-node.sh); an EC 4+2 pool and a x3 replicated pool, one RBD image
#    each of the working set's size, through the same phases (sbod bench --target rbd:...).
# 4. OUT/compare.md and OUT/compare.json: every system's cells side by side, with ratios to
#    the one BASELINE; each run's own sbod report (HTML, Markdown, JSON) under OUT/<system>.
#
# The default is the small bounded one (6 x 1 GiB sparse files, 2 workloads, 1 s runs: a few
# minutes on two cores). --long: 30 s runs, 3 repetitions, the demo's workloads and a QD sweep.
# Everything it starts (sbod servers, Ceph daemons) is stopped and the member files removed;
# the reports stay in OUT.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
members=6
size=1G
ws=256M
runtime=1
reps=1
ramp=0
workloads=randread-4k,randwrite-4k
sweep=()
out=bench-ceph
while [ $# -gt 0 ]; do
  case "$1" in
    --members) members=$2; shift 2 ;;
    --size-each) size=$2; shift 2 ;;
    --working-set) ws=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --qd-sweep) sweep=(--qd-sweep "$2"); shift 2 ;;
    --long) runtime=30; reps=3; ramp=5
            workloads=randread-4k,randwrite-4k,randrw70-4k,seqread-1m,seqwrite-1m,qd1-randread-4k,qd1-randwrite-4k
            sweep=(--qd-sweep 1,4,16,64); shift ;;
    *) echo "bench-ceph: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$members" -ge 6 ] || { echo "bench-ceph: EC 4+2 needs 6 members" >&2; exit 2; }
sbod=${SBOD:-$root/target/debug/sbod}
[ -x "$sbod" ] || sbod=$(command -v sbod) || { echo "bench-ceph: build sbod first (cargo build -p sbod)" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench-ceph: install fio (scripts/deps.sh)" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/sbod-bench-ceph.XXXXXX")
export SBOD_STATE_DIR=$work/state
cleanup() {
  "$here/ceph-single-node.sh" down "$work/ceph" 2>/dev/null || true
  for a in ec42 mirror3; do "$sbod" stop "$a" >/dev/null 2>&1 || true; "$sbod" forget "$a" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The member files are sparse, but preconditioning, rebuilds and the OSDs' BlueStore
# metadata write into them: a file system that fills up makes the OSDs die (ENOSPC), so ask
# for room for half of every member up front.
need=$(( $(numfmt --from=iec "${size%B}") * members / 2 ))
free=$(( $(stat -f -c '%a*%S' "$work") ))
[ "$free" -ge "$need" ] || { echo "bench-ceph: $(dirname "$work") has $(numfmt --to=iec $free) free; the run needs about $(numfmt --to=iec $need) (set TMPDIR elsewhere or use a smaller --size-each)" >&2; exit 1; }

files=()
for i in $(seq 0 $((members - 1))); do
  f=$work/m$i.img
  truncate -s "$size" "$f"
  files+=("$f")
done
wipe() { for f in "${files[@]}"; do truncate -s 0 "$f"; truncate -s "$size" "$f"; done; }

# One client connection on both sides: fio's rbd engine is one librbd client of the image,
# so sbod's arrays get one NBD connection too (`--connections 1`; docs/LAB.md).
common=(--workloads "$workloads" --runtime "$runtime" --ramp "$ramp" --reps "$reps"
        --precondition seq --working-set "$ws" --destructive "${sweep[@]}" --connections 1)
t0=$(date +%s)
systems=()

echo "== sbod ec:4+2 on $members x $size (with BASELINE)" >&2
"$sbod" create ec42 --level ec:4+2 --assume-clean --force "${files[@]:0:6}" >/dev/null
"$sbod" bench ec42 "${common[@]}" --out "$out/sbod-ec42" >&2
systems+=("sbod ec:4+2=$out/sbod-ec42/bench.json")
"$sbod" forget ec42 >/dev/null; wipe

echo "== sbod raid10 x3 (2 mirror sets of 3)" >&2
"$sbod" create mirror3 --level raid10 --copies 3 --assume-clean --force "${files[@]:0:6}" >/dev/null
"$sbod" bench mirror3 "${common[@]}" --phases nominal,device-down,device-rebuild --out "$out/sbod-mirror3" >&2
systems+=("sbod raid10 x3=$out/sbod-mirror3/bench.json")
"$sbod" forget mirror3 >/dev/null; wipe

echo "== Ceph on the same files" >&2
list=$(IFS=,; echo "${files[*]:0:6}")
"$here/ceph-single-node.sh" up "$work/ceph" --files "$list" >&2
conf=$work/ceph/ceph.conf
"$here/ceph-single-node.sh" pool "$work/ceph" ec42 ec:4+2 32 >&2
"$here/ceph-single-node.sh" pool "$work/ceph" rep3 rep:3 32 >&2
"$here/ceph-single-node.sh" image "$work/ceph" ec42 lab "$ws" >/dev/null
"$here/ceph-single-node.sh" image "$work/ceph" rep3 lab "$ws" >/dev/null
for p in ec42-meta:ceph-ec42:"Ceph EC 4+2" rep3:ceph-rep3:"Ceph x3"; do
  pool=${p%%:*}; rest=${p#*:}; dirname=${rest%%:*}; title=${rest#*:}
  echo "== $title" >&2
  "$sbod" bench --target "rbd:$pool/lab" --ceph-conf "$conf" "${common[@]}" --out "$out/$dirname" >&2
  systems+=("$title=$out/$dirname/bench.json")
done
"$here/ceph-single-node.sh" down "$work/ceph" >&2

python3 - "$out" "$(($(date +%s) - t0))" "${systems[@]}" <<'EOF'
import json, sys
out, secs, systems = sys.argv[1], sys.argv[2], sys.argv[3:]
reps = []
for s in systems:
    title, path = s.split("=", 1)
    reps.append((title, json.load(open(path))))
base = reps[0][1]
def cell(r, phase, w, qd):
    for c in r["cells"]:
        if c["phase"] == phase and c["workload"] == w and c["iodepth"] == qd:
            return c
bycount = lambda w: w["id"].startswith("seq")
phases = ["nominal", "device-down", "device-rebuild"]
titles = {"baseline": "BASELINE", "nominal": "NOMINAL", "device-down": "DEVICE DOWN", "device-rebuild": "DEVICE REBUILD"}
a = base["array"]
lines = [f"# sbod beside Ceph on the same {len(a['members'])} member files of {a['members'][0]['size_bytes'] / 2**30:.1f} GiB",
         "", f"{base['started']}, {secs} s in all; {base['settings']['repetitions']} x {base['settings']['runtime_secs']} s per measurement, "
         f"working set {base['settings']['working_set_bytes'] / 2**20:.0f} MiB; machine: {base['machine']['cpu_model']} ({base['machine']['cpus']} CPUs). "
         "In parentheses: the ratio to BASELINE (the member files alone, measured once).", ""]
head = "| workload | phase | BASELINE | " + " | ".join(t for t, _ in reps) + " |"
lines += [head, "|---|---|---:|" + "---:|" * len(reps)]
rows = []
for w in base["workloads"]:
    qds = [w["iodepth"]] if not w["sweep"] else base["settings"]["qd_sweep"]
    for qd in qds:
        b = cell(base, "baseline", w["id"], qd)
        key = "bw_bytes" if bycount(w) else "iops"
        fmt = (lambda c: f"{c['mean']['bw_bytes'] / 1e6:.0f} MB/s") if key == "bw_bytes" else (lambda c: f"{c['mean']['iops']:.0f} IOPS")
        for ph in phases:
            row = {"workload": w["id"], "iodepth": qd, "phase": ph, "baseline": b["mean"][key] if b else None, "systems": {}}
            cols = []
            for t, r in reps:
                c = cell(r, ph, w["id"], qd)
                if c is None:
                    cols.append("-"); continue
                ratio = c["mean"][key] / b["mean"][key] if b and b["mean"][key] else None
                row["systems"][t] = {key: c["mean"][key], "p99_ns": c["mean"]["lat_p99_ns"], "ratio": ratio,
                                     "server_cpu_pct": c["mean"]["server_cpu_pct"]}
                cols.append(fmt(c) + (f" ({ratio:.2f})" if ratio is not None else "") + f", p99 {c['mean']['lat_p99_ns'] / 1e6:.1f} ms")
            rows.append(row)
            lines.append(f"| {w['title'] if not w['sweep'] else w['title'] + f' QD{qd}'} | {titles[ph]} | {fmt(b) if b else '-'} | " + " | ".join(cols) + " |")
lines += ["", "| system | layout | rebuild or recovery | server CPU% (NOMINAL, mean) | IOPS per CPU% (NOMINAL, mean) |", "|---|---|---|---:|---:|"]
for t, r in reps:
    rb = r.get("rebuild") or {}
    d, rate = rb.get("duration_secs"), rb.get("rate_bytes_per_sec")
    rtext = f"{rb.get('bytes', 0) / 2**20:.0f} MiB in {d:.1f} s ({rate / 2**20:.1f} MiB/s)" if d and rate else "-"
    cpus = [c["mean"]["server_cpu_pct"] for c in r["cells"] if c["phase"] == "nominal"]
    eff = [c["mean"]["iops_per_cpu_pct"] for c in r["cells"] if c["phase"] == "nominal" and c["mean"]["iops_per_cpu_pct"] > 0]
    lines.append(f"| {t} | {r['array']['level']} | {rtext} | {sum(cpus) / max(len(cpus), 1):.0f} | {sum(eff) / max(len(eff), 1):.0f} |")
lines += ["", "sbod's rebuild rewrites the whole failed member; Ceph's recovery recreates the object copies the restarted OSD missed while it was out (DEVICE DOWN's writes), so compare their rates, not their sizes. Server CPU: the sbod server, or the cluster's ceph-osd daemons.", "", "Each system's own report: " + ", ".join(f"{t}: {p.split('=',1)[1].replace('bench.json', 'report.html')}" for (t, _), p in zip(reps, systems)), ""]
open(f"{out}/compare.md", "w").write("\n".join(lines))
json.dump({"schema": "sbod-bench-compare/1", "systems": [{"title": t, "report": p.split("=", 1)[1], "level": r["array"]["level"], "rebuild": r.get("rebuild")} for (t, r), p in zip(reps, systems)], "rows": rows},
          open(f"{out}/compare.json", "w"), indent=1)
print("\n".join(lines))
EOF
echo "bench-ceph: $out/compare.md, $out/compare.json" >&2

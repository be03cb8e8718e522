#!/usr/bin/env bash
# Torture beyond CI's bounded runs, with the figures docs/RELIABILITY.md publishes:
#   - power cuts that drop and tear unflushed member writes (every redundant layout),
#     and power cuts with a member lost as well;
#   - member faults: EIO at chosen offsets and rates, latency spikes, a member vanishing
#     mid-I/O, silent bit flips found and repaired by scrub;
#   - SIGKILL of `sbod serve` under libnbd clients (sbod-torture), per layout;
#   - hostile input: the superblock parser and assembly, the NBD handshake and requests;
#   - the trust model: random lives of an array (restarts, crashes, members hidden and
#     brought back, old copies put back, fails past redundancy, rescues) against a model;
#   - sync modes under power cuts, each against what it promises;
#   - the log device: power cuts (dropped and torn log writes) with a member lost, replay
#     closing the write hole (and the same workload without a log, to show the hole).
#
#   scripts/torture.sh [--scale N | --long] [--out DIR] [--levels raid5,raid6,...]
#
# --scale N multiplies CI's iterations (default 5); --long is --scale 30 (hours on 2
# cores). Replay a failure with the SBOD_TORTURE_SEED it prints. Writes DIR/figures.jsonl
# (one JSON line per suite) and DIR/summary.md (default DIR: target/torture).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=5
out=target/torture
levels=raid5,raid6,raid10,ec:4+2
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) scale="$2"; shift 2 ;;
    --long) scale=30; shift ;;
    --out) out="$2"; shift 2 ;;
    --levels) levels="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "torture.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
report="$out/figures.jsonl"
: >"$report"
export SBOD_TORTURE_REPORT="$report"
start=$(date +%s)

echo "== build" >&2
cargo build --locked --bins -p sbod -p sbod-torture --quiet
export SBOD_BIN="$PWD/target/debug/sbod"

suite() { # ITERS, then cargo test arguments
  local iters="$1"; shift
  echo "== $* (iterations $iters)" >&2
  SBOD_TORTURE_ITERS="$iters" SBOD_FUZZ_CASES="$scale" \
    cargo test --locked --quiet "$@" -- --test-threads 1 >"$out/last-suite.log" 2>&1 || {
    cat "$out/last-suite.log" >&2
    echo "torture.sh: FAILED: $*" >&2
    exit 1
  }
}
suite $((10 * scale)) -p sbod-core --test engine torture_powercut::
suite $((2 * scale)) -p sbod-core --test engine torture_faults::
suite $((6 * scale)) -p sbod-core --test engine sync_modes::
suite $((12 * scale)) -p sbod-core --test engine log::
suite $((2 * scale)) -p sbod-core --test engine log_array::
suite 1 -p sbod-core --test engine torture_fuzz::
export SBOD_LIFECYCLE_CASES=$((400 * scale))
suite 1 -p sbod-core --test engine lifecycle::
suite 1 -p sbod-nbd --test nbd fuzz::

IFS=, read -ra lv <<<"$levels"
for l in "${lv[@]}"; do
  echo "== SIGKILL of sbod serve, $l ($((4 * scale)) kills)" >&2
  members=6
  case "$l" in raid5) members=5 ;; raid10) members=4 ;; esac
  target/debug/sbod-torture --sbod "$SBOD_BIN" --level "$l" --members "$members" \
    --member-mib 32 --crashes $((4 * scale)) --json >"$out/sigkill.json" || {
    echo "torture.sh: FAILED: sbod-torture --level $l" >&2
    exit 1
  }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["test"]="sigkill"; print(json.dumps(d))' \
    "$out/sigkill.json" >>"$report"
done
rm -f "$out/sigkill.json" "$out/last-suite.log"

python3 - "$report" "$scale" "$(($(date +%s) - start))" >"$out/summary.md" <<'EOF'
import json, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
scale, secs = sys.argv[2], int(sys.argv[3])
mib = lambda b: f"{b / 2**20:,.0f} MiB"


def verified(r):
    return f"{r['durable_blocks_verified'] + r['unflushed_blocks_verified']:,} ({mib(r['bytes_verified'])})"

def resynced(r):
    space = r['member_space_at_restarts']
    return f"{mib(r['resynced_bytes'])} / {mib(space)} ({100 * r['resynced_bytes'] / max(1, space):.1f}%)"
def table(title, cols, rs, cells):
    """One Markdown table (title, header, a row of cells per figure), if there are figures."""
    if not rs:
        return
    print(f"\n### {title}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rs:
        print("| " + " | ".join(str(c) for c in cells(r)) + " |")

def by_test(name):
    return [r for r in rows if r.get("test") == name]

def faults(r):
    f = r["faults"]
    return ", ".join(f"{k} {v}" for k, v in f.items()) if isinstance(f, dict) else str(f)

def hostile(r):
    if r.get("suite") == "nbd-fuzz":
        return ["NBD handshake and requests (sessions over a socket)",
                f"{r['sessions']} ({r['mutated']} mutated, {mib(r['bytes_sent'])} sent)",
                f"panics {r['panics']}, hangs {r['hangs']}, other export touched: never, well-behaved client served after"]
    o = r["outcomes"]
    return [r["test"], r["inputs"],
            ", ".join(f"{k}: {v}" for k, v in sorted(o.items())) if isinstance(o, dict) else str(o)]

print(f"Run: `scripts/torture.sh --scale {scale}` ({secs // 60} min on this machine).")
table("Power cuts (unflushed member writes dropped or torn)",
      ["layout", "power cuts", "of them during assembly", "writes acked (FUA)", "flushes",
       "unflushed writes at the cut: landed / torn / dropped", "blocks verified",
       "resynced / member space", "scrubs clean", "lost"],
      by_test("powercut"),
      lambda r: [r["layout"], r["crashes"], r["cuts_during_assembly"], f"{r['writes_acked']} ({r['fua_acked']})",
                 r["flushes_acked"], f"{r['unflushed_landed']} / {r['unflushed_torn']} / {r['unflushed_dropped']}",
                 verified(r), resynced(r), r["scrubs_clean"], r["lost"]])
table("Power cut and a member lost at once",
      ["layout", "crashes", "served correctly", "refused (clear error)", "wrong data"],
      by_test("powercut_and_member_lost"),
      lambda r: [r["layout"], r["crashes"], r["served_correctly"], r["refused"], 0])
table("Log devices failing under writers, then a power cut",
      ["runs", "log failed (both devices) before the cut", "log degraded (one device)", "lost"],
      by_test("log_device_failures"),
      lambda r: [r["log_failed_before_the_cut"] + r["log_degraded_before_the_cut"],
                 r["log_failed_before_the_cut"], r["log_degraded_before_the_cut"], 0])
table("Sync modes under power cuts",
      ["layout", "mode", "power cuts", "writes acked (FUA)", "flushes", "blocks verified",
       "promise broken", "blocks lost that standard keeps"],
      by_test("sync_modes"),
      lambda r: [r["layout"], r["mode"], r["crashes"], f"{r['writes_acked']} ({r['fua_acked']})",
                 r["flushes_acked"], f"{r['blocks_verified']:,}", r["broken_promises"],
                 r["blocks_lost_that_standard_keeps"]])
table("The write hole: power cut and a member lost, with and without a log",
      ["log", "crashes", "writes acked", "records replayed", "wrong blocks"],
      by_test("log_write_hole"),
      lambda r: ["yes" if r["log"] else "no (control)", r["crashes"], r["writes_acked"],
                 r["records_replayed"], r["wrong_blocks"]])
table("SIGKILL of `sbod serve` under libnbd clients",
      ["layout", "kills (writing / starting / scrubbing)", "writes acked (FUA)", "flushes",
       "restarts verified (unclean)", "blocks verified", "resynced / member space",
       "scrubs (mismatches)", "lost"],
      by_test("sigkill"),
      lambda r: [r["layout"], f"{r['crashes']} ({r['kills_while_writing']} / {r['kills_while_starting']} / {r['kills_while_scrubbing']})",
                 f"{r['writes_acked']} ({r['fua_acked']})", r["flushes_acked"],
                 f"{r['restarts_verified']} ({r['unclean_restarts']})", verified(r), resynced(r),
                 f"{r['scrubs']} ({r['scrub_mismatches']})", r["lost_blocks"]])
table("Member faults",
      ["test", "faults injected", "sectors repaired by rewrite", "members failed", "rebuilds",
       "bytes verified", "bit flips injected / found / repaired (not locatable by design)",
       "clear errors", "wrong data"],
      [r for r in rows if "faults" in r and "test" in r and r.get("test") not in ("powercut",)],
      lambda r: [r["test"], faults(r), r["repaired_sectors"], r["members_failed"], r["rebuilds"],
                 mib(r["bytes_verified"]),
                 f"{r['flips_injected']} / {r['flips_found']} / {r['flips_repaired']} ({r['flips_unrecoverable_by_design']})",
                 r["clear_errors_returned"], r["wrong_data_returned"]])
table("Lives of an array (the trust model)",
      ["cases", "steps", "starts", "refused: member missing / fail past redundancy",
       "stale members found", "recovered from the bitmap / in full", "re-added while running",
       "rescues (read-only)", "blocks verified", "clear errors", "wrong data"],
      by_test("lifecycle"),
      lambda r: [r["cases"], r["steps"], r["starts"],
                 f"{r['refused_missing']} / {r['refused_past_redundancy']}", r["stale_found"],
                 f"{r['bitmap_recoveries']} / {r['full_recoveries']}", r["re_adds"], r["rescues"],
                 f"{r['blocks_verified']:,}", r["errors_returned"], r["wrong"]])
table("Hostile input", ["target", "inputs", "outcomes"],
      [r for r in rows if "inputs" in r or r.get("suite") == "nbd-fuzz"], hostile)
EOF
cat "$out/summary.md"
echo "torture.sh: figures in $out/figures.jsonl, summary in $out/summary.md" >&2

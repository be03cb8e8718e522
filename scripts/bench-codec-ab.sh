#!/usr/bin/env bash
# Row-by-row A/B of sbod's parity codec: a git revision against the working tree. Builds
# bench/codec for both, runs the two binaries in turn ROUNDS times (each run measures sbod,
# ISA-L and klauspost/reedsolomon on the same buffers, as scripts/bench-codec.sh does),
# and prints per row the best sbod GB/s of each build over the rounds and its ratio to the
# best of the faster peer over all rounds. On a shared machine whole-table medians move by
# 5-10% between batches of runs; best-of-rounds, with the builds taking turns, resolves
# changes of a few percent in one row (docs/PERFORMANCE.md). Rows whose kernels the change
# does not touch are the control: their "tree / REV" column shows this machine's spread.
#
#   scripts/bench-codec-ab.sh REV [--rounds N] [--filter TEXT]... [--sizes 4096,65536,...]
#
# --filter may be given several times (rows matching any). Defaults: 4 rounds, every row,
# shard sizes 4 KiB, 64 KiB and 1 MiB. Not part of the test suite; needs what
# scripts/bench-codec.sh needs, and REV must have bench/codec.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 REV [--rounds N] [--filter TEXT]... [--sizes LIST]" >&2; exit 2; }
REV=$(git rev-parse --verify "$1^{commit}") || { echo "bench-codec-ab: no such revision: $1" >&2; exit 2; }
shift
ROUNDS=4
SIZES=4096,65536,1048576
FILTERS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --filter) FILTERS+=("$2"); shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    *) echo "bench-codec-ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#FILTERS[@]} -gt 0 ] || FILTERS=("")
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
out="${CARGO_TARGET_DIR:-$PWD/target}/bench-codec-ab"
mkdir -p "$out"
WT=$(mktemp -d "$out/base-src.XXXXXX")
RUNS=$(mktemp -d "$out/runs.XXXXXX")
cleanup() {
  git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"
  rm -rf "$RUNS"
}
trap cleanup EXIT

kp=()
if command -v go >/dev/null 2>&1 && (cd bench/codec/klauspost && go build -o "$out/klauspost-bench" . 2>"$out/go-build.log"); then
  kp=(--klauspost "$out/klauspost-bench")
else
  echo "bench-codec-ab: no usable Go toolchain (see $out/go-build.log): ISA-L is the only peer" >&2
fi

# One target directory for both trees (cargo keeps units from different paths apart); the
# binary is copied out after each build.
build() {
  CARGO_TARGET_DIR="$out/target" cargo build --release --locked --quiet --manifest-path "$1/bench/codec/Cargo.toml"
  cp "$out/target/release/sbod-codec-peers" "$2"
}
git worktree prune
git worktree add --detach --force "$WT" "$REV" >/dev/null 2>&1
[ -f "$WT/bench/codec/Cargo.toml" ] || { echo "bench-codec-ab: $REV has no bench/codec" >&2; exit 2; }
build "$WT" "$out/base"
build "$PWD" "$out/new"

for r in $(seq "$ROUNDS"); do
  # Alternate which build goes first: running second is not the same machine state.
  order=(base new)
  [ $((r % 2)) -eq 1 ] || order=(new base)
  for b in "${order[@]}"; do
    for i in "${!FILTERS[@]}"; do
      "$out/$b" "${kp[@]}" --filter "${FILTERS[$i]}" --sizes "$SIZES" \
        --json-out "$RUNS/$b.$r.$i.json" >/dev/null
    done
  done
  echo "bench-codec-ab: round $r of $ROUNDS done" >&2
done

python3 - "$RUNS" "$(git rev-parse --short "$REV")" <<'PY'
import glob, json, os, sys
runs, rev = sys.argv[1], sys.argv[2]
best = {}  # (row, build) -> best sbod GB/s
peer = {}  # row -> best GB/s of the faster peer, over all rounds of both builds
order = []
for path in sorted(glob.glob(os.path.join(runs, "*.json"))):
    build = os.path.basename(path).split(".")[0]
    for r in json.load(open(path))["rows"]:
        key = (r["case"], r["shard_bytes"], r["working_set"])
        if key not in peer:
            order.append(key)
            peer[key] = 0.0
        best[key, build] = max(best.get((key, build), 0.0), r["sbod"]["best_gbps"])
        for p in ("isal", "klauspost"):
            if r.get(p):
                peer[key] = max(peer[key], r[p]["best_gbps"])
size = lambda b: f"{b >> 20}M" if b >= 1 << 20 else f"{b >> 10}K"
print(f"| case | shard | set | faster peer GB/s | {rev} GB/s | working tree GB/s | {rev} / peer | tree / peer | tree / {rev} |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for key in order:
    case, shard, ws = key
    p, b, n = peer[key], best.get((key, "base")), best.get((key, "new"))
    if not (p and b and n):
        continue
    print(f"| {case} | {size(shard)} | {ws} | {p:.1f} | {b:.1f} | {n:.1f} | {b / p:.2f} | {n / p:.2f} | {n / b:.2f} |")
PY

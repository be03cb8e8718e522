#!/usr/bin/env bash
# The whole test suite: unit, property and end-to-end tests through real clients.
# Bounded for CI (2 cores, well under 20 minutes). Longer torture: see docs/RELIABILITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo test --workspace --locked

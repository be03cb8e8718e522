#!/usr/bin/env bash
# The whole test suite: unit, property and end-to-end tests through real clients.
# Bounded for CI (2 cores, under 30 minutes with the build). Longer torture: see docs/RELIABILITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
# Build every test first, then hand the harnesses that run `sbod` as a process the binary
# this build made: sbod-torture's `sbod_binary()` otherwise runs `cargo build -p sbod`, whose
# features differ from the whole workspace's (getrandom, regex-syntax), and rebuilt sbod and
# 20 of its dependencies inside a test: 5-9 minutes of a 2-core CI run.
cargo test --workspace --locked --no-run
export SBOD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/sbod"
# Four tests at a time in each test binary, on two cores: the tests wait more than they
# compute (leases, timeouts, daemons coming up, modelled drives), so the engine's 178 took
# 126 s two at a time and 75 s four at a time, with 1.2 cores busy (docs/PERFORMANCE.md,
# "The test suite's own time"). RUST_TEST_THREADS set by the caller wins.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo test --workspace --locked

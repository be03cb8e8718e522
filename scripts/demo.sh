#!/usr/bin/env bash
# sbod's first command: install what it needs, build it, and run `sbod demo`, the storage lab
# on file-backed members in ./sbod-demo: a short fio benchmark through BASELINE (the members
# without RAID), NOMINAL, DEVICE DOWN and DEVICE REBUILD, with a summary table here and an
# HTML report in ./sbod-demo/report/. The members are removed afterwards.
#
#   scripts/demo.sh [sbod demo options: --dir DIR --qd-sweep --level L --members N ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p sbod
exec "${CARGO_TARGET_DIR:-target}/release/sbod" demo "$@"

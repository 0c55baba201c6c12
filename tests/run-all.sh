#!/usr/bin/env bash
# Every test of the project: format and lint checks, Rust tests, the Python package's tests
# (real torch), and a short run of every fuzz target. Needs what .ci/run installs.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --all-targets -- -D warnings
echo "== cargo test"
cargo test
echo "== feature cuda: clippy, tests (without a GPU driver they check the clear no-driver error)"
cargo clippy --all-targets --features cuda -- -D warnings
cargo test --features cuda --lib capture
cargo test --features cuda --test cuda_no_driver

if [ -f tools/python/Cargo.toml ]; then
  echo "== python package: fmt, clippy, build, pytest"
  cargo fmt --manifest-path tools/python/Cargo.toml -- --check
  cargo clippy --manifest-path tools/python/Cargo.toml --all-targets -- -D warnings
  cargo clippy --manifest-path tools/python/Cargo.toml --all-targets --features cuda -- -D warnings
  python3 -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./tools/python
fi
echo "== pytest"
# -rs prints why tests skip (the CudaWriter GPU tests where there is no GPU).
(cd tools/python/tests && python3 -m pytest -q -rs -p no:cacheprovider .)
echo "== spec reader: the golden vectors read with FORMAT.md alone, value by value"
(cd tests/spec_reader && python3 -m pytest -q -p no:cacheprovider .)

echo "== fuzz (short runs: no crash, no panic)"
secs="${HSPACK_FUZZ_SECONDS:-20}"
for target in $(cd fuzz && cargo fuzz list); do
  echo "-- fuzz $target (${secs}s)"
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | tail -n 3)
done
echo "== all tests passed"

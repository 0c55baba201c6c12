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
echo "== failpoints: a writer and convert crashed at each publish step (feature failpoints)"
cargo clippy --all-targets --features failpoints -- -D warnings
cargo test --features failpoints --test failpoints
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

echo "== fuzz (short runs: no crash, no panic; seeded with valid files of each kind)"
secs="${HSPACK_FUZZ_SECONDS:-20}"
# Valid inputs each target starts from, so it gets past magics and checksums: the committed
# fixtures and golden vectors where they are of the target's kind, fuzz/seeds/ otherwise.
seeds_for() {
  case "$1" in
    pickle|torch_zip|npy|safetensors) echo ../tests/fixtures/pt ../tests/bad_files/convert ;;
    manifest|shard|samples_table) echo ../format-spec/golden/v1/none ../format-spec/golden/v1/zstd ;;
    *) echo "seeds/$1" ;;
  esac
}
# Memory used is capped at 2 GiB (-rss_limit_mb); one allocation may reserve more (the parquet
# decoder reserves capacity from counts a file declares and never touches most of it).
for target in $(cd fuzz && cargo fuzz list); do
  echo "-- fuzz $target (${secs}s; the first target builds the fuzz crate, which takes minutes)"
  mkdir -p "fuzz/corpus/$target"
  # shellcheck disable=SC2046
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "corpus/$target" $(seeds_for "$target") \
    -- -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=16384 2>&1 | grep -E "^Done|INITED|panicked|ERROR|SUMMARY" | tail -n 4)
done
echo "== all tests passed"

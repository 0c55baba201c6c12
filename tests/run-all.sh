#!/usr/bin/env bash
# Every test of the project: format and lint checks, Rust tests, the Python package's tests
# (real torch), and a short run of every fuzz target. Needs what .ci/run installs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs a long, chatty step with its output in a file: a line a minute says it is still going,
# and the file's end is printed if the step fails.
quietly() {
  local what=$1 log start pid rc next=60
  shift
  log=$(mktemp)
  start=$SECONDS
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - start)) -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
      echo "   ... $what: $((next / 60)) min so far"
      next=$((next + 60))
    fi
  done
  rc=0
  wait "$pid" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 60 "$log"
    rm -f "$log"
    echo "$what failed (exit $rc)" >&2
    return "$rc"
  fi
  rm -f "$log"
  echo "   $what: done in $((SECONDS - start)) s"
}

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
  echo "-- building and installing the Python package (a release build of the Rust extension: several minutes the first time)"
  quietly "pip install ./tools/python" python3 -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./tools/python
fi
echo "== pytest"
# -rs prints why tests skip (the CudaWriter GPU tests where there is no GPU).
(cd tools/python/tests && python3 -m pytest -q -rs -p no:cacheprovider .)
echo "== spec reader: the golden vectors read with FORMAT.md alone, value by value"
(cd tests/spec_reader && python3 -m pytest -q -p no:cacheprovider .)

echo "== fuzz (short runs: no crash, no panic; seeded with valid files of each kind)"
secs="${HSPACK_FUZZ_SECONDS:-20}"
# Valid inputs each target starts from, so it gets past magics and checksums: the committed
# fixtures and golden vectors where they are of the target's kind, fuzz/seeds/ otherwise.
seeds_for() {
  case "$1" in
    # The pickle target reads bare pickles: the fixtures' `data.pkl` entries, in seeds/pickle.
    pickle) echo ../tests/fixtures/pt ../tests/bad_files/convert seeds/pickle ;;
    torch_zip|npy|safetensors) echo ../tests/fixtures/pt ../tests/bad_files/convert ;;
    manifest|shard) echo ../format-spec/golden/v1/none ../format-spec/golden/v1/zstd ../format-spec/golden/v1/zstd-bytegroup ../format-spec/golden/v2/stacked ../format-spec/golden/v3/leased ../format-spec/golden/v4/leased ../format-spec/golden/v4/segments ../format-spec/golden/v4/stacked ../format-spec/golden/v5/quantized ;;
    segment) echo ../format-spec/golden/v4/segments ../format-spec/golden/v4/leased ;;
    store) echo ../format-spec/golden/store-v1 ../format-spec/golden/store-v1/packs ../format-spec/golden/store-v1/datasets ../format-spec/golden/store-v1/captures ../format-spec/golden/v4/segments ;;
    *) echo "seeds/$1" ;;
  esac
}
echo "-- building the fuzz targets (with sanitizers: several minutes the first time)"
(cd fuzz && quietly "cargo fuzz build" env RUSTC_BOOTSTRAP=1 cargo fuzz build)
for target in $(cd fuzz && cargo fuzz list); do
  echo "-- fuzz $target (${secs}s)"
  mkdir -p "fuzz/corpus/$target"
  # A fuzz run prints a line per new input: keep its summary, or its end when it fails.
  log=$(mktemp)
  # shellcheck disable=SC2046
  if ! (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "corpus/$target" $(seeds_for "$target") \
    -- -max_total_time="$secs" -rss_limit_mb=2048) >"$log" 2>&1; then
    tail -n 60 "$log"
    rm -f "$log"
    echo "fuzz target $target failed" >&2
    exit 1
  fi
  grep -E "INITED|^Done" "$log" | tail -n 2
  rm -f "$log"
done
echo "== all tests passed"

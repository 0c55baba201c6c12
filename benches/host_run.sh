#!/usr/bin/env bash
# The Python suite, the loader benchmark and the conversion benchmark on a bigger host (such as
# the GPU machine, which has no Rust), from a built wheel and a built `hspack` binary. Results go
# to $OUT (default /tmp/hspack-host-out).
#
#   maturin build --release -m tools/python/Cargo.toml -o .whl-hspack
#   cargo build --release && mkdir -p .whl-hspack/bin && cp target/release/hspack .whl-hspack/bin/
#   OUT=/tmp/out GB=4 WORKERS=8 benches/host_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hspack-host-out}
GB=${GB:-4}
WORKERS=${WORKERS:-8}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .whl-hspack/hspack-*.whl || exit 1
# Without pytest or ml_dtypes there, carry their wheels in .whl-hspack/deps.
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .whl-hspack/deps/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{
  nproc; free -g; df -h /dev/shm /tmp | cat
  python3 -c 'import torch, hspack; print("torch", torch.__version__, "hspack", hspack.__version__)'
} 2>&1 | tee "$OUT/env.txt"
(cd tools/python && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider --ignore tests/test_convert_torch.py tests) 2>&1 | tail -15 | tee "$OUT/pytest.txt"
timeout 300 python3 benches/python/bench_loader.py --gb "$GB" --workers "$WORKERS" --dir /tmp --out "$OUT/loader.md" 2>&1 | tail -25
timeout 140 python3 benches/convert/bench_convert.py --gb "$GB" --dir /dev/shm --repeat 3 --bin .whl-hspack/bin/hspack 2>&1 | tee "$OUT/convert.md" | tail -25

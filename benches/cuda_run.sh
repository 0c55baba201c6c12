#!/usr/bin/env bash
# The CUDA writer's GPU tests and benchmark, from a built wheel, on a machine with a GPU and
# PyTorch. Results go to $OUT (default /tmp/hspack-cuda-out).
#
#   maturin build --release -m tools/python/Cargo.toml --features cuda -o .whl-hspack
#   OUT=/tmp/out benches/cuda_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hspack-cuda-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .whl-hspack/hspack-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, hspack; print("torch", torch.__version__, "cuda", torch.version.cuda, "hspack", hspack.__version__)'
  df -h /dev/shm /tmp | cat
} 2>&1 | tee "$OUT/env.txt"
cd tools/python
# Without pytest there, carry its wheels in .whl-hspack/deps (pytest, pluggy, iniconfig, packaging).
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site ../../.whl-hspack/deps/*.whl
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda_writer.py 2>&1 | tee "$OUT/pytest.txt"
cd ../..
timeout 280 python3 benches/cuda_capture.py --out "$OUT/cuda_capture.json" 2>&1 | tee "$OUT/bench.txt"

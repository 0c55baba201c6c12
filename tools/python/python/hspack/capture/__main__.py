"""``python -m hspack.capture`` points at the two drivers."""

import sys

print(
    "usage: python -m hspack.capture.hf extract ... | python -m hspack.capture.sglang extract ...",
    file=sys.stderr,
)
sys.exit(2)

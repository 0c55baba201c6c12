"""hspack: read and write datasets of LLM hidden states.

    import hspack
    ds = hspack.open("data/")            # Dataset
    ds[0]                                # {"input_ids": tensor, "hidden.2": tensor, ...}
    ds.sample(0).key                     # key, ordinal, rows, tensors
    with hspack.Writer("out/", [hspack.token_ids(), hspack.hidden_state(2, 4096)]) as w:
        w.append("s0", input_ids=ids, **{"hidden.2": h})

PyTorch datasets, samplers and the EAGLE-3 view live in `hspack.torch`.
"""

from ._dataset import Dataset, Sample, open
from ._errors import HspackError
from ._hspack import __version__, init_store
from ._schema import field, hidden_state, hidden_states, loss_mask, token_ids
from ._verify import compare, copy, verify
from ._writer import Writer, capture_key

__all__ = [
    "init_store",
    "Dataset",
    "HspackError",
    "Sample",
    "Writer",
    "__version__",
    "capture_key",
    "copy",
    "field",
    "hidden_state",
    "hidden_states",
    "loss_mask",
    "open",
    "token_ids",
    "verify",
    "compare",
]

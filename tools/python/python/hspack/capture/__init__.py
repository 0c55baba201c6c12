"""Capturing LLM hidden states into hspack datasets.

Two front ends share one convention and one output protocol:

* ``hspack.capture.hf``: hooks on a Hugging Face transformers model (CPU or GPU).
* ``hspack.capture.sglang``: hooks inside an SGLang engine's prefill passes.

Layer ids follow Hugging Face ``output_hidden_states=True``: id ``i`` is the
INPUT to decoder layer ``i`` (``hidden_states[i]``, id 0 = embeddings), which is
SGLang's ``layers_to_capture`` entry ``i`` (``hidden_states + residual`` at the
top of layer ``i``); id ``num_layers`` is the final-norm output
(``hidden_states[-1]``). Each field's schema role records its id and point
(``layer_input`` or ``final_norm``).

Output goes to a sink: anything with ``append(key, **tensors)`` and
``contains(key)``, such as ``hspack.Writer`` or ``MemorySink``. This package
imports neither the compiled extension nor SGLang at import time.
"""

from .cuda_writer import CudaWriter
from .errors import CaptureError, RowMismatch, UnsupportedSetup
from .points import CapturePoints
from .sink import MemorySink, Sink

__all__ = ["CaptureError", "CapturePoints", "CudaWriter", "MemorySink", "RowMismatch", "Sink", "UnsupportedSetup"]

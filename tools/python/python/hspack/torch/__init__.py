"""PyTorch integration: datasets, samplers, batching and the EAGLE-3 view.

    from hspack.torch import HspackIterableDataset, HspackLoader, PadCollate
    ds = HspackIterableDataset("data/", view="eagle3", seed=0)
    loader = HspackLoader(ds, batch_size=4, num_workers=2, collate_fn=PadCollate(max_len=4096))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader: ...
        # checkpoint: loader.state_dict(); resume: loader.load_state_dict(state), then this
        # loop over range(state["epoch"], epochs): set_epoch keeps the loaded position

Where each iteration starts (after set_epoch, load_state_dict, a complete or a broken-off
epoch) is one rule for all of them: `hspack.torch.progress`.
"""

from .batching import CollateToPinned, PadCollate, TokenBudgetBatchSampler, pad_collate
from .datasets import HspackDataset, HspackIterableDataset, HspackSampler
from .loader import HspackLoader
from .order import epoch_order, partition
from .views import Eagle3View, FieldsView, eagle3_fields

__all__ = [
    "CollateToPinned",
    "Eagle3View",
    "FieldsView",
    "HspackDataset",
    "HspackIterableDataset",
    "HspackLoader",
    "HspackSampler",
    "PadCollate",
    "TokenBudgetBatchSampler",
    "eagle3_fields",
    "epoch_order",
    "pad_collate",
    "partition",
]

"""Splitting batched rows back into samples.

Two batch shapes occur: padded ``[batch, seq, ...]`` tensors with an attention
mask (Hugging Face), and packed ``[tokens, ...]`` tensors with per-request
lengths (SGLang). Both splitters check every count and raise ``RowMismatch``
rather than guess.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .errors import RowMismatch

__all__ = ["split_packed", "unpad", "real_token_index"]


def split_packed(packed: torch.Tensor, lengths: Sequence[int]) -> List[torch.Tensor]:
    """Split ``packed[tokens, ...]`` into consecutive pieces of ``lengths`` rows (views)."""
    lengths = [int(n) for n in lengths]
    if any(n < 0 for n in lengths):
        raise RowMismatch(f"negative lengths in {lengths}")
    total = sum(lengths)
    if packed.dim() < 1 or packed.shape[0] != total:
        raise RowMismatch(
            f"packed tensor has {packed.shape[0] if packed.dim() else 0} rows, "
            f"the lengths {lengths} add up to {total}"
        )
    return list(torch.split(packed, lengths, dim=0))


def real_token_index(attention_mask: torch.Tensor) -> List[torch.Tensor]:
    """Per row of a ``[batch, seq]`` 0/1 mask, the indices of its real tokens.

    Real tokens must be one contiguous run (left or right padding); a mask with
    holes is refused, since positions would not match an unpadded run.
    """
    if attention_mask.dim() != 2:
        raise RowMismatch(f"attention mask must be [batch, seq], got {tuple(attention_mask.shape)}")
    mask = attention_mask.to(torch.bool).cpu()
    out = []
    for b in range(mask.shape[0]):
        idx = torch.nonzero(mask[b], as_tuple=False).flatten()
        if idx.numel() and int(idx[-1] - idx[0]) + 1 != idx.numel():
            raise RowMismatch(f"row {b} of the attention mask is not one contiguous run of tokens")
        out.append(idx)
    return out


def unpad(batch: torch.Tensor, attention_mask: torch.Tensor) -> List[torch.Tensor]:
    """Remove padding from ``batch[b, seq, ...]`` using the mask; one tensor per row."""
    if batch.shape[:2] != attention_mask.shape:
        raise RowMismatch(
            f"batch {tuple(batch.shape)} does not match attention mask {tuple(attention_mask.shape)}"
        )
    return [batch[b, idx.to(batch.device)] for b, idx in enumerate(real_token_index(attention_mask))]

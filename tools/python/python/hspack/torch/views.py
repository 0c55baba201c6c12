"""Views: what a torch dataset returns for one sample.

`FieldsView` returns `{field: tensor}` (plus `ordinal`); `Eagle3View` returns the keys an
EAGLE-3 trainer consumes. Views are small picklable objects applied to an open
`hspack.Dataset`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .._dataset import Fields, _as_index, _names
from .._errors import make_error
from .._dtypes import torch_dtypes
from .. import _hspack
from .._hspack import EAGLE3
from .._tensors import to_torch
from . import transfer

# The keys of the two EAGLE-3 layouts, as the Rust side defines them (`hspack::format::eagle3`).
_VIEW = EAGLE3["view"]
_SPECFORGE = EAGLE3["specforge_item"]


def shared_empty(shape: Sequence[int], dtype: Any) -> Any:
    """An uninitialized tensor; in a DataLoader worker it is allocated in shared memory, so
    sending it to the main process copies nothing. That memory is lent to the main process and
    reused for a later sample once the main process has dropped every tensor over it
    (`hspack.torch.transfer`): no fresh pages to fault in and zero for each sample."""
    import torch
    from torch.utils.data import get_worker_info

    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=dtype)
    numel = 1
    for d in shape:
        numel *= int(d)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if numel and transfer.installed():
        try:
            raw = to_torch(_hspack.take_shared(numel * itemsize))
            return raw.view(dtype).view(tuple(shape))
        except OSError:
            pass  # no memory file here: torch's own shared memory, as for any tensor
    storage = torch.UntypedStorage._new_shared(numel * itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))


def pinned_empty(shape: Sequence[int], dtype: Any) -> Any:
    """An uninitialized tensor in pinned (page-locked) memory, which the accelerator copies
    from without staging."""
    import torch

    return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)


def clip(rows: int, max_len: int | None) -> int:
    return rows if max_len is None else min(rows, max_len)


def max_len_option(max_len: Any) -> int | None:
    """`max_len` checked: None (every token) or an int of 1 or more. A negative one failed at
    every read (in a worker), 0 handed out samples of no tokens."""
    if max_len is None:
        return None
    n = _as_index(max_len)
    if n is None or n < 1:
        raise make_error("BadOption", f"option max_len: {max_len!r} must be an int of 1 or more tokens (or None for every token)", option="max_len")
    return n


def refused(ds: Any, option: str, message: str, kind: str = "BadOption", field: str | None = None) -> Exception:
    """The error for a view that dataset `ds` cannot serve, as option `option` stands: an
    `HspackError` naming the option, the dataset and the field. A view's `check` raises it
    when the torch dataset is built, so a bad option fails there, not in a DataLoader worker."""
    return make_error(kind, f"option {option}: {message}", option=option, path=ds.path, field=field)


def require_fields(ds: Any, option: str, names: Sequence[str]) -> None:
    """Refuses `names` (given by option `option`) that `ds` has no field of, naming the
    missing one and the fields it has."""
    have = [f["name"] for f in ds.schema]
    for name in names:
        if name not in have:
            message = f"dataset {ds.path} has no field {name!r}; it has: {', '.join(have)}"
            raise refused(ds, option, message, kind="NoSuchField", field=name)


class FieldsView:
    """`{field: tensor}` of the chosen `fields` (all when None), the first `max_len` rows
    (all when None), plus `ordinal` (int)."""

    def __init__(self, fields: Sequence[str] | None = None, max_len: int | None = None):
        self.fields = _names(fields)
        self.max_len = max_len_option(max_len)

    def check(self, ds: Any) -> None:
        """Refuses fields the dataset has not: the torch datasets call it when built, before
        any worker starts."""
        if self.fields == []:
            raise make_error("BadOption", "option fields: [] reads no field; name the fields to read, or give None for all of them", option="fields")
        if self.fields is not None:
            require_fields(ds, "fields", self.fields)

    def __call__(self, ds: Any, ordinal: int) -> dict:
        rows = None
        if self.max_len is not None:
            rows = (0, clip(ds.rows_of(ordinal), self.max_len))
        out = ds.read(ordinal, self.fields, rows)
        out["ordinal"] = ordinal
        return out


def _point_rank(role: dict) -> tuple:
    """Where a hidden state lies in the model, for ordering: the final-norm state after every
    layer whatever layer id it was given (a capture that named it after the last layer, not
    past it, made a layer's output the target and put the final norm among the auxiliary
    layers, shapes unchanged), then by layer, a layer's input before its output."""
    order = {"layer_input": 0, "layer_output": 1, "final_norm": 2}
    final = role["point"] == "final_norm"
    return (final, role["layer"] + (1 if role["point"] != "layer_input" else 0), order[role["point"]])


def eagle3_fields(schema: list[dict]) -> tuple[list[str], str]:
    """`(auxiliary fields, target field)` of a schema: the target is the final-norm state
    when there is one, else the deepest captured layer; the auxiliary fields are the other
    hidden states, shallowest first, or the one field stacking layers when there is one."""
    stacked = [f for f in schema if f["role"].get("kind") == "hidden_states"]
    single = [f for f in schema if f["role"].get("kind") == "hidden_state"]
    if len(stacked) == 1 and single:
        single.sort(key=lambda f: _point_rank(f["role"]))
        return [stacked[0]["name"]], single[-1]["name"]
    if stacked:
        raise make_error("BadOption", "option view: the EAGLE-3 view needs one stacked field and a target hidden state; name them with Eagle3View(aux_fields=[...], target_field=...)", option="view")
    hidden = single
    if len(hidden) < 2:
        raise make_error("BadOption", "option view: the EAGLE-3 view needs at least two hidden-state fields (auxiliary layers and a target)", option="view")
    hidden.sort(key=lambda f: _point_rank(f["role"]))
    return [f["name"] for f in hidden[:-1]], hidden[-1]["name"]


def _one_dtype(ds: Any, aux: Sequence[str]) -> None:
    """Refuses auxiliary fields of mixed dtypes: the view concatenates them into one tensor of
    one dtype, and bytes of one dtype read as another are wrong values, not an error."""
    dtypes = {f["name"]: f["dtype"] for f in ds.schema}
    if len({dtypes[a] for a in aux}) > 1:
        listed = ", ".join(f"{a} ({dtypes[a]})" for a in aux)
        message = (
            f"the auxiliary fields of dataset {ds.path} have different dtypes: {listed}; the EAGLE-3 view concatenates "
            "them into one tensor of one dtype. Convert them to one dtype, or read them with a FieldsView "
            "(view=None, fields=[...]) and concatenate them yourself"
        )
        raise refused(ds, "view", message, field=next(a for a in aux if dtypes[a] != dtypes[aux[0]]))


def _role_field(schema: list[dict], kind: str) -> str | None:
    return next((f["name"] for f in schema if f["role"].get("kind") == kind), None)


class Eagle3View:
    """The EAGLE-3 training view of a sample.

    `layout="hspack"` (default) returns `[T, ...]` tensors:
    `input_ids [T]`, `loss_mask [T]`, `aux_hidden_state [T, sum of aux widths]` (the
    auxiliary layers concatenated on the last dim, shallowest first, e.g. `[T, 3H]`),
    `hidden_state [T, H]` (the target: final-norm state, else the deepest layer), and
    `ordinal`. The dataset must hold the token ids (a `hspack.token_ids()` field), the
    fields named, and auxiliary fields of one dtype (`check`); without a loss mask field,
    the mask is all ones.

    `layout="specforge"` returns exactly what SpecForge's offline EAGLE-3 dataset item holds,
    ready for its padding collator and training loop: `input_ids [1, T]`,
    `loss_mask [1, T]` (last position zeroed, as SpecForge does), `attention_mask [1, T]`
    (ones, int64), `hidden_state [1, T, 3H]` (the auxiliary concatenation) and
    `target [1, T, H]`.

    When the auxiliary layers are one stacked field (`hspack.hidden_states`, what
    `hspack convert` writes from SpecForge and ModelOpt dumps), `aux_hidden_state` is a view of
    the mapped shard: no copy. Otherwise it is built with one copy from the mapping, GIL
    released: inside DataLoader workers into shared memory the worker lends to the trainer
    and reuses once the trainer drops it (`shared_empty`), else into memory the process reuses
    from earlier samples it dropped (`hspack.Dataset.read_concat`).
    """

    def __init__(
        self,
        aux_fields: Sequence[str] | None = None,
        target_field: str | None = None,
        max_len: int | None = None,
        layout: str = "hspack",
    ):
        if layout not in ("hspack", "specforge"):
            raise make_error("BadOption", "option layout: must be \"hspack\" or \"specforge\"", option="layout")
        self.aux_fields = list(aux_fields) if aux_fields is not None else None
        self.target_field = target_field
        self.max_len = max_len_option(max_len)
        self.layout = layout

    def _resolve(self, ds: Any) -> tuple[list[str], str, str, str | None]:
        aux, target = self.aux_fields, self.target_field
        if aux is None or target is None:
            a, t = eagle3_fields(ds.schema)
            aux = aux if aux is not None else a
            target = target if target is not None else t
        if not aux:
            raise refused(ds, "aux_fields", "the EAGLE-3 view concatenates the auxiliary hidden states, and none is named; name at least one, or leave aux_fields None for the dataset's own")
        require_fields(ds, "aux_fields", aux)
        require_fields(ds, "target_field", [target])
        _one_dtype(ds, aux)
        ids = _role_field(ds.schema, "token_ids")
        if ids is None:
            # Without them `input_ids` would be None, and the collate fail far from here.
            message = (
                f"the EAGLE-3 view needs the token ids, and dataset {ds.path} has no token_ids field "
                "(written from hspack.token_ids()); capture them with the hidden states, or read this dataset with view=None and the fields it has"
            )
            raise refused(ds, "view", message, field="token_ids")
        return aux, target, ids, _role_field(ds.schema, "loss_mask")

    def check(self, ds: Any) -> None:
        """Refuses a dataset this view cannot serve (no token ids, no hidden states to tell
        apart, auxiliary or target fields it has not, auxiliary fields of mixed dtypes): the
        torch datasets call it when built, before any worker starts. Warns, once per dataset
        built, when the dataset has no loss mask: every token is then trained on."""
        mask = self._resolve(ds)[3]
        if mask is None:
            import warnings

            warnings.warn(
                f"dataset {ds.path} has no loss mask field (hspack.loss_mask()): the EAGLE-3 view hands out a loss mask of ones, "
                "so the drafter trains on every token, prompt included; capture or convert the mask with the hidden states where only some tokens count",
                stacklevel=4,
            )

    def __call__(self, ds: Any, ordinal: int) -> dict:
        import torch

        aux, target, ids_field, mask_field = self._resolve(ds)
        by_name = {f["name"]: f for f in ds.schema}
        n = clip(ds.rows_of(ordinal), self.max_len)
        small = [ids_field] + ([mask_field] if mask_field is not None else [])
        if len(aux) == 1 and by_name[aux[0]]["role"].get("kind") == "hidden_states":
            parts = ds.read(ordinal, small + aux + [target], (0, n))
            stacked, shape = parts[aux[0]], by_name[aux[0]]["shape"]
            # Shallowest first, as separate fields are: a field stacking its layers in
            # another order ([30, 2, 16]) is reordered (a copy).
            layers = by_name[aux[0]]["role"]["layers"]
            order = sorted(range(len(layers)), key=lambda j: layers[j])
            if order != list(range(len(layers))):
                stacked = stacked.reshape(n, *shape)[:, order]
            # The width named, not -1: a sample of 0 tokens has no rows to infer it from.
            out = stacked.reshape(n, math.prod(shape))
        else:
            from torch.utils.data import get_worker_info

            if get_worker_info() is None:
                # In the trainer: memory this process reuses, already faulted in.
                out = ds.read_concat(ordinal, aux, (0, n))
            else:
                # In a worker: shared memory, which the trainer maps without a copy.
                first = by_name[aux[0]]
                width = sum(math.prod(by_name[a]["shape"]) for a in aux)
                out = shared_empty((n, width), torch_dtypes()[first["dtype"]])
                flat = out.view(-1).view(torch.uint8).numpy()
                ds.native.read_concat_into(ordinal, aux, (0, n), flat)
            parts = ds.read(ordinal, small + [target], (0, n))
        ids = parts[ids_field]
        mask = parts[mask_field] if mask_field else torch.ones(n, dtype=torch.int64)
        if self.layout == "hspack":
            return Fields({_VIEW["input_ids"]: ids, _VIEW["loss_mask"]: mask, _VIEW["aux"]: out, _VIEW["target"]: parts[target], "ordinal": ordinal})
        mask = mask.clone()
        if n:
            mask[-1] = 0
        return Fields({
            _SPECFORGE["input_ids"]: ids[None],
            _SPECFORGE["loss_mask"]: mask[None],
            _SPECFORGE["attention_mask"]: torch.ones((1, n), dtype=torch.int64),
            _SPECFORGE["aux"]: out[None],
            _SPECFORGE["target"]: parts[target][None],
        })

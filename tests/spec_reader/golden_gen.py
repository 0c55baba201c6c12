"""The data the golden vectors hold, generated again in Python.

A port of `format-spec/golden.rs` and the SplitMix64 generator of `src/synth.rs`: the same
schemas, sample keys, row counts and bytes, so a reader's output can be compared value by value.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1

# Rows of sample i ("golden-{i}").
LENGTHS = [0, 1, 3, 4, 5, 15, 16, 17, 2]

# Samples per shard the golden writer was given: 5 for v1 to v3, 1 for v4/segments.
SHARD_SAMPLES = 5


def shard_sizes(per_shard: int = SHARD_SAMPLES) -> list:
    """Samples of each shard when the golden samples are cut every `per_shard`."""
    n = len(LENGTHS)
    return [min(per_shard, n - start) for start in range(0, n, per_shard)]

DTYPE_BYTES = {
    "bool": 1,
    "u8": 1,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
}


class SplitMix64:
    """SplitMix64, as `hspack::synth::Rng`."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def v1_schema() -> list:
    """(name, dtype, shape, role) of the v1 datasets: one [3] field per dtype."""
    roles = {"i32": {"kind": "token_ids"}, "u8": {"kind": "loss_mask"}}
    return [(d, d, [3], roles.get(d, {"kind": "other"})) for d in DTYPE_BYTES]


def v2_schema() -> list:
    """(name, dtype, shape, role) of v2/stacked."""
    return [
        ("input_ids", "i32", [], {"kind": "token_ids"}),
        (
            "aux_hidden_state",
            "bf16",
            [3, 4],
            {"kind": "hidden_states", "layers": [2, 30, 58], "point": "layer_input"},
        ),
        ("hidden.61", "bf16", [4], {"kind": "hidden_state", "layer": 61, "point": "final_norm"}),
    ]


def row_bytes(dtype: str, shape: list) -> int:
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


def samples(schema: list) -> list:
    """(key, rows, {field: bytes}) for every golden sample, in ordinal order."""
    rng = SplitMix64(1)
    out = []
    for i, rows in enumerate(LENGTHS):
        fields = {}
        for name, dtype, shape, _ in schema:
            n = rows * row_bytes(dtype, shape)
            if dtype in ("bool", "u8"):
                fields[name] = bytes(rng.next_u64() & 1 for _ in range(n))
            else:
                fields[name] = bytes(rng.next_u64() & 0xFF for _ in range(n))
        out.append((f"golden-{i}", rows, fields))
    return out


def v5_schema() -> list:
    """(name, dtype, shape, role, group) of v5/quantized; group 0 for the field stored exactly."""
    def hidden(layer):
        return {"kind": "hidden_state", "layer": layer, "point": "layer_input"}

    return [
        ("input_ids", "i32", [], {"kind": "token_ids"}, 0),
        (
            "aux_hidden_state",
            "bf16",
            [3, 4],
            {"kind": "hidden_states", "layers": [2, 30, 58], "point": "layer_input"},
            4,
        ),
        ("hidden.f32", "f32", [4], hidden(7), 2),
        ("hidden.f16", "f16", [6], hidden(8), 6),
        ("hidden.exact", "bf16", [4], hidden(9), 0),
    ]


def quantized_value(rng: SplitMix64) -> float:
    """`quantized_value` of format-spec/golden.rs: m · 2^e from one draw (exact in float)."""
    r = rng.next_u64()
    m = ((r >> 11) % 2001) - 1000
    e = ((r >> 3) % 22) - 16
    return float(m) * 2.0**e


def v5_values() -> list:
    """(key, rows, {field: list of floats, before any rounding to the dtype}) of v5/quantized:
    token ids are the row numbers; rows where sample + row is a multiple of 5 are zeros."""
    rng = SplitMix64(5)
    out = []
    for i, rows in enumerate(LENGTHS):
        fields = {}
        for name, dtype, shape, _, _ in v5_schema():
            elems = 1
            for d in shape:
                elems *= d
            values = []
            for r in range(rows):
                for _ in range(elems):
                    v = 0.0 if (i + r) % 5 == 0 else quantized_value(rng)
                    values.append(float(r) if dtype == "i32" else v)
            fields[name] = values
        out.append((f"golden-{i}", rows, fields))
    return out

"""`HspackError`, the one exception class of hspack, and a constructor for Python-side errors."""

from __future__ import annotations

from typing import Any

from ._hspack import ERROR_CONTEXT, HspackError

# Class-level defaults: an error re-raised from a DataLoader worker is rebuilt from its message
# alone (torch keeps the type and the text), so its context attributes read as None.
for _name in ("kind", *ERROR_CONTEXT):
    if not hasattr(HspackError, _name):
        setattr(HspackError, _name, None)


def make_error(kind: str, message: str, **context: Any) -> HspackError:
    """An `HspackError` of `kind` with the same attributes the native errors carry."""
    err = HspackError(message)
    err.kind = kind
    for name in ERROR_CONTEXT:
        setattr(err, name, context.get(name))
    return err


def kind_of(value: Any) -> str:
    """What `value` is, for an error: its type's name with its article (`an int`, `a list`)."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


__all__ = ["HspackError", "make_error", "kind_of"]

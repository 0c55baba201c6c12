"""Exceptions raised by the capture layers.

Every message says what went wrong and what to change. ``CaptureError`` is the
base; catch it to handle any capture failure.
"""

from __future__ import annotations

__all__ = ["CaptureError", "RowMismatch", "UnsupportedSetup", "command_errors"]


class CaptureError(RuntimeError):
    """A capture step could not produce correct rows."""


class RowMismatch(CaptureError):
    """Captured rows do not line up with the tokens they are supposed to belong to.

    Raised instead of dropping or re-assigning rows: shapes, lengths, positions
    or token ids disagree with what the batch declares.
    """


class UnsupportedSetup(CaptureError):
    """The model or engine runs in a mode whose rows cannot be captured faithfully.

    The message names the setting to change (for example ``--disable-radix-cache``).
    """


def command_errors() -> tuple:
    """What the capture commands report as a plain error (exit 2), not a traceback: bad
    input (``ValueError``, ``OSError``), a refused capture (``CaptureError``), an hspack error."""
    import hspack

    return (ValueError, OSError, CaptureError, hspack.HspackError)

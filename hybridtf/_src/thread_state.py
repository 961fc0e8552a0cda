"""Thread-local settings scoped to a ``with`` block (trace-time flags of hybridtf's rewrites)."""

from __future__ import annotations

import contextlib
import threading


@contextlib.contextmanager
def setting(state: threading.local, name: str, value, default=None):
    """Sets ``state.<name>`` to ``value`` inside the block and restores the previous value (``default`` if
    unset) after it, also when the block raises; yields ``value``. Nested blocks restore in order."""
    previous = getattr(state, name, default)
    setattr(state, name, value)
    try:
        yield value
    finally:
        setattr(state, name, previous)

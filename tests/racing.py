"""Thread plumbing shared by the concurrency stress tests of the HybridHash store."""

from __future__ import annotations

import threading
from collections.abc import Sequence


def run_racing(background: Sequence[threading.Thread], workers: Sequence[threading.Thread], stop: threading.Event):
    """Starts every thread, waits for the workers to finish, then sets ``stop`` and waits for the background ones."""
    for t in (*background, *workers):
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in background:
        t.join()

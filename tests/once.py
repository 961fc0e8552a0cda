"""Expensive module fixtures computed once per test session, whichever pytest-xdist workers ask.

A module fixture (a ``horovodrun`` launch, a wheel build) runs once per *worker* that gets one of
the module's tests. ``./dev.sh test`` keeps such a module on one worker (``--dist loadgroup`` and
the module's ``xdist_group`` mark), but nothing should depend on that scheduling: two workers
building the same wheel in the checkout's ``build/`` directory at once break each other's build,
and two ``horovodrun`` launches of the same scenarios double the suite's slowest part.

``computed_once`` fills one directory under the session's shared base temp directory, under a file
lock: the first worker computes, the others wait and reuse it. A failed computation is recorded,
so the other workers fail at once with its message instead of running it again.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import traceback
from collections.abc import Callable

import pytest


def computed_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[pathlib.Path], None]
) -> pathlib.Path:
    """The directory ``compute(directory)`` filled, computed by the first worker of this session that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's base: each worker's own is popen-gwN under it
    out, failed = root / f"once-{name}", root / f"once-{name}.failed"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if failed.exists():
            pytest.fail(f"{name} failed in another worker of this session:\n{failed.read_text()}", pytrace=False)
        if not (out / ".complete").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            try:
                compute(out)
            except BaseException:
                failed.write_text(traceback.format_exc()[-12000:])
                raise
            (out / ".complete").touch()
    return out

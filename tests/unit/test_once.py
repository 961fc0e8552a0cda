"""``tests/once.py``: an expensive fixture's directory is computed once, by whichever caller comes first."""

from __future__ import annotations

import threading
import time

import pytest

from tests.once import computed_once


def test_concurrent_callers_compute_once_and_share_the_directory(tmp_path_factory):
    calls, dirs = [], []

    def compute(out):
        calls.append(out)
        time.sleep(0.3)  # the other callers arrive while this one computes
        (out / "result.txt").write_text("42")

    def ask():
        dirs.append(computed_once(tmp_path_factory, "shared", compute))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(dirs)) == 1
    assert (dirs[0] / "result.txt").read_text() == "42"
    assert computed_once(tmp_path_factory, "shared", compute) == dirs[0] and len(calls) == 1


def test_a_failure_is_not_computed_again(tmp_path_factory):
    calls = []

    def compute(out):
        calls.append(out)
        raise RuntimeError("horovodrun failed: rank 1 exited with 134")

    with pytest.raises(RuntimeError, match="rank 1 exited"):
        computed_once(tmp_path_factory, "failing", compute)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)failed in another worker.*rank 1 exited"):
        computed_once(tmp_path_factory, "failing", compute)
    assert len(calls) == 1

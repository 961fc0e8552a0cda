"""``tools/slow_tests.py``: the slow-tier list written from a ``--durations=0`` report."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "slow_tests.py"
REPORT = """
============================= slowest durations ==============================
12.50s setup    tests/multiprocess/test_x.py::test_a[two ranks]@test_x
3.00s call     tests/multiprocess/test_x.py::test_a[two ranks]@test_x
6.00s call     tests/unit/test_y.py::test_b
5.00s setup    tests/unit/test_y.py::test_b
7.99s call     tests/unit/test_y.py::test_c
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def _tool():
    spec = importlib.util.spec_from_file_location("slow_tests_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_durations_sum_the_phases_of_a_test_and_drop_the_xdist_group():
    measured = _tool().durations(REPORT)
    assert measured == {
        "tests/multiprocess/test_x.py::test_a[two ranks]": 15.5,
        "tests/unit/test_y.py::test_b": 11.0,
        "tests/unit/test_y.py::test_c": 7.99,
    }


def test_the_list_holds_the_tests_at_or_above_the_threshold(tmp_path):
    log, out = tmp_path / "durations.log", tmp_path / "slow.txt"
    log.write_text(REPORT)
    assert _tool().main([str(log), "--threshold", "8", "--out", str(out)]) == 0
    listed = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert listed == ["tests/multiprocess/test_x.py::test_a[two ranks]", "tests/unit/test_y.py::test_b"]


def test_a_log_without_durations_is_a_usage_error(tmp_path, capsys):
    log = tmp_path / "empty.log"
    log.write_text("1 passed in 0.1s\n")
    with pytest.raises(SystemExit) as stop:
        _tool().main([str(log), "--out", str(tmp_path / "slow.txt")])
    assert stop.value.code == 2
    assert "no '--durations' lines" in capsys.readouterr().err

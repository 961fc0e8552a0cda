"""Dynamic (HybridHash) tables in an Estimator model_fn under ``horovodrun -np 2 --gloo``: refused, by name.

They are not sharded over ranks in Estimator model_fns yet; training them on
each rank would give each rank its own table, so the wrapper stops with a
message naming the tables (one process builds the same graph fine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # ~25 s: two launches

WORKER = os.path.join(os.path.dirname(__file__), "hvd_dynamic_estimator_worker.py")


def _run(cmd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_dynamic_tables_under_two_ranks_are_refused_by_name(tmp_path):
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    _run([sys.executable, WORKER, str(tmp_path)])
    _run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(tmp_path)])
    single = json.loads((tmp_path / "dynamic_1_0.json").read_text())
    assert single["error"] is None
    for rank in (0, 1):
        result = json.loads((tmp_path / f"dynamic_2_{rank}.json").read_text())
        assert result["size"] == 2
        assert "dynamic table(s) ['items'] under Horovod with 2 ranks" in result["error"]
        assert "Train them in one process" in result["error"]

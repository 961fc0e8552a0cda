"""Dynamic (HybridHash) tables in an Estimator model_fn under ``horovodrun -np 2 --gloo``: sharded by id.

The same model_fn (a DynamicEmbedding, Adagrad through
``hybridtf.horovod.DistributedOptimizer``) trains the same per-step losses
(1e-5 relative, flushes during the run) in one process and on 2 ranks, the
evaluation agrees, and every rank's checkpoint holds the whole table (the
ids and counts of the one process's, rows within 1e-5). A
``hybridtf.embedding.Tables`` dynamic table built before ``hvd.init()`` (not
sharded) is refused above one rank by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # ~40 s: two launches

WORKER = os.path.join(os.path.dirname(__file__), "hvd_dynamic_estimator_worker.py")


def _run(cmd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_estimator_dynamic_tables_sharded_over_two_ranks_train_like_one_process(tmp_path):
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    _run([sys.executable, WORKER, str(tmp_path)])
    _run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(tmp_path)])
    single = json.loads((tmp_path / "dynamic_1_0.json").read_text())
    assert single["tables_error"] is None and len(single["losses"]) == 10
    one = np.load(tmp_path / "table_1_0.npz")
    assert int(one["step"]) == 10
    for rank in (0, 1):
        result = json.loads((tmp_path / f"dynamic_2_{rank}.json").read_text())
        assert result["size"] == 2
        np.testing.assert_allclose(result["losses"], single["losses"], rtol=1e-5)
        np.testing.assert_allclose(result["eval_loss"], single["eval_loss"], rtol=1e-5)
        np.testing.assert_allclose(result["predictions"], single["predictions"], rtol=1e-5)
        assert len(result["predictions"]) == 8
        table = np.load(tmp_path / f"table_2_{rank}.npz")  # the whole table, gathered from both shards
        for field in ("ids", "counts", "step", "slot_init"):
            assert np.array_equal(table[field], one[field]), field
        for field in ("rows", "slots"):
            np.testing.assert_allclose(table[field], one[field], rtol=1e-5, atol=1e-7)
        assert "dynamic table 'users' was built before hvd.init()" in result["tables_error"]
        assert "Call hvd.init() before creating the hybridtf.embedding.Tables" in result["tables_error"]


def test_estimator_dynamic_adam_train_calls_to_the_end_of_the_input_on_two_ranks_equal_one_process(tmp_path):
    """Each rank applies the end-of-data decay to its shard before the (gathered) last checkpoint of a call."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    _run([sys.executable, WORKER, str(tmp_path), "adam_end_of_data"])
    _run(
        [
            horovodrun,
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--gloo",
            sys.executable,
            WORKER,
            str(tmp_path),
            "adam_end_of_data",
        ]
    )
    single = json.loads((tmp_path / "dynamic_1_0.json").read_text())
    one = np.load(tmp_path / "table_1_0.npz")
    assert len(single["losses"]) == 30 and int(one["step"]) == 30
    for rank in (0, 1):
        result = json.loads((tmp_path / f"dynamic_2_{rank}.json").read_text())
        np.testing.assert_allclose(result["losses"], single["losses"], rtol=1e-5)
        table = np.load(tmp_path / f"table_2_{rank}.npz")
        assert np.array_equal(table["ids"], one["ids"])
        for field in ("rows", "slots"):
            np.testing.assert_allclose(table[field], one[field], rtol=1e-5, atol=1e-7)

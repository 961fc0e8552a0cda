"""``hybridtf.embedding.Tables`` dynamic tables under ``horovodrun -np 2 --gloo``: sharded by id, exact.

Two launches of ``hvd_dynamic_tables_worker.py`` (one process, then 2 ranks)
on the same global batches of raw 64-bit ids. A ``Tables`` dynamic table
created after ``hvd.init()`` is sharded by id over the ranks, so 2 ranks
train what one process trains (per-step losses within 1e-5, flushes during
the runs) in a subclassed Keras model (``hvd.DistributedOptimizer``), in a
``hybridtf.function`` custom loop (``hybridtf.horovod.DistributedGradientTape``)
in an Estimator model_fn (``hybridtf.horovod.DistributedOptimizer``), and as two
``Tables`` sets that hold tables of the same name (``average_gradients``);
``tf.train.Checkpoint`` moves the table 1 -> 2 ranks bit for bit, and every
rank's checkpoint (and Estimator checkpoint) holds the whole table. A
``Tables`` built before ``hvd.init()`` raises instead of training a copy per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.once import computed_once

# ~30 s: two launches
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group("test_horovod_dynamic_tables")]

WORKER = os.path.join(os.path.dirname(__file__), "hvd_dynamic_tables_worker.py")
STEPS = 10  # the worker's STEPS
FIELDS = ("ids", "rows", "slots", "counts", "slot_init", "step")


def _run(cmd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def launch_all(out):
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        _run([sys.executable, WORKER, str(out)])
        _run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(out)])

    out = computed_once(tmp_path_factory, "horovod_dynamic_tables", launch_all)
    one = json.loads((out / "tables_1_0.json").read_text())
    two = [json.loads((out / f"tables_2_{r}.json").read_text()) for r in (0, 1)]
    return out, one, two


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=0)


@pytest.mark.parametrize("path", ["keras", "loop", "est", "twin", "untaped_static", "untaped_mixed"])
def test_two_ranks_train_what_one_process_trains(runs, path):
    _, one, two = runs
    assert len(one[f"{path}_losses"]) == STEPS
    for rank in (0, 1):
        _close(two[rank][f"{path}_losses"], one[f"{path}_losses"])
    if path in ("keras", "est"):
        for rank in (0, 1):
            _close(two[rank][f"{path}_eval"], one[f"{path}_eval"])  # read-only sharded lookups
    if path.startswith("untaped"):  # no Horovod tape or optimizer in the step: every rank's head is the same
        for rank in (0, 1):
            _close(two[rank][f"{path}_head"], one[f"{path}_head"])


def test_the_table_is_sharded_not_copied(runs):
    _, one, two = runs
    assert one["keras_sharded_tables"] == 0 and one["keras_flushes"] >= 2
    shares = [two[rank]["keras_local_size"] for rank in (0, 1)]
    assert sum(shares) == one["keras_local_size"]  # the shards partition the one process's rows
    assert min(shares) > 0.3 * sum(shares)
    for rank in (0, 1):
        assert two[rank]["keras_sharded_tables"] == 1  # save_weights of the model gathers it
        assert two[rank]["keras_flushes"] == one["keras_flushes"]
        assert two[rank]["keras_reload_identical"]  # save_weights (gathered, rank 0 writes) -> load_weights
    assert one["keras_reload_identical"]


def test_a_table_built_before_hvd_init_raises(runs):
    _, one, two = runs
    assert one["early_error"] is None
    for rank in (0, 1):
        error = two[rank]["early_error"]
        assert "dynamic table 'users' was built before hvd.init()" in error
        assert "Call hvd.init() before creating the hybridtf.embedding.Tables" in error


def _checkpoint(path):
    reader = tf.train.load_checkpoint(str(path))
    return {f: reader.get_tensor(f"tables/users/.ATTRIBUTES/{f}") for f in FIELDS}


def test_checkpoints_move_between_one_and_two_ranks(runs):
    out, _, two = runs
    c1, restored = np.load(out / "c1_1.npz"), np.load(out / "restored_2.npz")
    for field in FIELDS:  # 1 -> 2 ranks: the restored shards, gathered, are c1 bit for bit
        assert c1[field].dtype == restored[field].dtype and np.array_equal(c1[field], restored[field]), field
    assert sum(two[rank]["restored_local_size"] for rank in (0, 1)) == c1["ids"].size
    for rank in (0, 1):  # each rank's tf.train.Checkpoint holds the whole table, as one process writes it
        c2 = _checkpoint(out / f"c2_rank{rank}" / "ckpt")
        for field in ("ids", "counts", "step", "slot_init"):
            assert np.array_equal(c2[field], c1[field]), field
        for field in ("rows", "slots"):
            np.testing.assert_allclose(c2[field], c1[field], rtol=1e-5, atol=1e-7)


def test_estimator_checkpoints_hold_the_whole_table(runs):
    out, _, _ = runs
    single = np.load(out / "est_table_1_0.npz")
    assert int(single["step"]) == STEPS
    for rank in (0, 1):
        table = np.load(out / f"est_table_2_{rank}.npz")
        for field in ("ids", "counts", "step", "slot_init"):
            assert np.array_equal(table[field], single[field]), field
        for field in ("rows", "slots"):
            np.testing.assert_allclose(table[field], single[field], rtol=1e-5, atol=1e-7)

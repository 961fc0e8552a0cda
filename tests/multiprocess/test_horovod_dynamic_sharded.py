"""Dynamic (HybridHash) tables sharded by id over 2 Horovod ranks train exactly what one process trains.

Three launches of ``hvd_dynamic_worker.py`` (one process, ``horovodrun -np 2
--gloo``, one process again) on the same global batches of raw 64-bit ids:

* exactness: per-step losses of 2 ranks and of one process agree within 1e-5
  relative, both tables packed into one store by ``optimize`` (on 2 ranks the
  store is sharded by id: one alltoall per step for the group), with Adagrad
  and with Adam (``hvd.DistributedOptimizer``), and in a custom loop
  (``htf.horovod.DistributedGradientTape``); left unpacked (each table sharded
  on its own) with a static table beside them (hybridtf averages); with a plain
  Keras optimizer and only dynamic tables (hybridtf averages); flushes during
  the runs;
* checkpoints 1 -> 2 ranks of the packed model: the 2 ranks' restored tables,
  gathered, are the one process's checkpoint bit for bit (ids, rows, slots,
  counts, step), through ``save_weights`` and ``tf.train.Checkpoint`` alike,
  and the later training agrees with the one process's own continuation;
* checkpoints 2 -> 1: the same, the other way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.once import computed_once

# ~60-80 s on the loaded 2-core machine: three launches
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group("test_horovod_dynamic_sharded")]

WORKER = os.path.join(os.path.dirname(__file__), "hvd_dynamic_worker.py")
STEPS = 12  # the worker's STEPS


def _run(cmd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def launch_all(out):
        one, two, back = (out / n for n in ("one", "two", "back"))
        for d in (one, two, back):
            d.mkdir()
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        _run([sys.executable, WORKER, str(one), "train"])
        c1 = str(one / "c1" / "ckpt")
        hvd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER]
        _run([*hvd, str(two), "train+restore", c1, str(STEPS)])
        _run([sys.executable, WORKER, str(back), "restore", str(two / "c2" / "ckpt"), str(STEPS + 6)])

    out = computed_once(tmp_path_factory, "horovod_dynamic_sharded", launch_all)
    one, two, back = (out / n for n in ("one", "two", "back"))
    return {
        "one": json.loads((one / "train_1_0.json").read_text()),
        "two": [json.loads((two / f"train+restore_2_{r}.json").read_text()) for r in (0, 1)],
        "back": json.loads((back / "restore_1_0.json").read_text()),
        "dirs": (one, two, back),
    }


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=0)


def _same_tables(path_a, path_b):
    a, b = np.load(path_a), np.load(path_b)
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert np.array_equal(a[key], b[key]), f"{key} differs"  # bit for bit


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_two_ranks_train_what_one_process_trains(runs, kind):
    one, two = runs["one"], runs["two"]
    assert len(one[f"{kind}_losses"]) == STEPS
    for rank in (0, 1):
        _close(two[rank][f"{kind}_losses"], one[f"{kind}_losses"])
        _close(two[rank][f"{kind}_eval"], one[f"{kind}_eval"])  # read-only lookups: nothing inserted
        _close(two[rank][f"{kind}_after_broadcast"], one[f"{kind}_after_broadcast"])  # fit + broadcast callback
        assert two[rank][f"{kind}_size_after_eval"] == two[rank][f"{kind}_local_sizes"][0]
        assert two[rank][f"{kind}_flushes"] >= 2  # Algorithm 1 refilled the hot tiers during the run
        assert not two[rank][f"{kind}_skipped"]  # packed on 2 ranks too: one sharded store for both tables
    assert one[f"{kind}_flushes"] >= 2 and not one[f"{kind}_skipped"]
    # each rank holds its share of the pairs only: the shards partition the rows of the one process's store
    # (which holds both tables: its size is their sum; every member layer reports its store)
    shares = [two[rank][f"{kind}_local_sizes"][0] for rank in (0, 1)]
    assert sum(shares) == one[f"{kind}_local_sizes"][0]
    assert min(shares) > 0.3 * sum(shares)


def test_end_of_data_of_unknown_length_on_two_ranks(runs):
    """Each epoch of a filtered dataset ends with a step that finds no batch: Keras Adam decays every row's moments
    there and counts the step; on 2 ranks each rank's store decays its stored rows, as one process's does."""
    one = runs["one"]
    assert one["end_of_data_iterations"] == 2 + 2 * (3 + 1) + 2  # train, 2 epochs of 3 batches + the end, train
    for rank in (0, 1):
        _close(runs["two"][rank]["end_of_data_losses"], one["end_of_data_losses"])
        assert runs["two"][rank]["end_of_data_iterations"] == one["end_of_data_iterations"]


@pytest.mark.parametrize("tag", ["mixed", "mixed_packed"])
def test_mixed_static_and_dynamic(runs, tag):
    """hybridtf's own averaging (a static table sharded too), dynamic tables packed into one store or not."""
    for rank in (0, 1):
        _close(runs["two"][rank][f"{tag}_losses"], runs["one"][f"{tag}_losses"])
        # the static shard and the tables' buffers (one per table unpacked, the store's one packed)
        assert runs["two"][rank][f"{tag}_static_sharded"] >= (3 if tag == "mixed" else 2)
        assert runs["two"][rank][f"{tag}_reload_identical"]  # save_weights (rank 0 writes) -> load_weights
        assert runs["two"][rank][f"{tag}_skipped"] == runs["one"][f"{tag}_skipped"]
    assert runs["one"]["mixed_skipped"] == ["bag_emb", "one_emb"] and runs["one"]["mixed_packed_skipped"] == []
    assert runs["one"]["mixed_reload_identical"] and runs["one"]["mixed_packed_reload_identical"]


def test_a_layer_called_on_two_inputs(runs):
    """Alone in its group: left unpacked in one process (two fills append to its buffer); on 2 ranks a store of its
    own serves both calls with one exchange (the unpacked sharded layer refuses a second lookup in a step)."""
    assert any("nothing to pack" in r for r in runs["one"]["shared_skipped"])
    for rank in (0, 1):
        assert runs["two"][rank]["shared_skipped"] == []
        _close(runs["two"][rank]["shared_losses"], runs["one"]["shared_losses"])


def test_dynamic_optimizer_of_a_horovod_optimizer(runs):
    """``dynamic_optimizer(hvd.DistributedOptimizer(opt))`` (the other order) trains as one process (it recursed
    forever: Horovod's methods call ``super(self.__class__, self)``)."""
    for rank in (0, 1):
        _close(runs["two"][rank]["adagrad_hvd_first_losses"], runs["one"]["adagrad_hvd_first_losses"])
    _close(runs["one"]["adagrad_hvd_first_losses"], runs["one"]["adagrad_losses"])  # the same model and steps


def test_a_plain_keras_optimizer_without_horovods_trains_as_one_process(runs):
    """Only dynamic tables and ``compile(optimizer=Adagrad)``: hybridtf averages the dense gradients (each rank
    trained its own dense layers, silently; found by a probe), as with static tables."""
    for rank in (0, 1):
        _close(runs["two"][rank]["adagrad_plain_losses"], runs["one"]["adagrad_losses"])
    assert runs["two"][0]["adagrad_plain_dense"] == runs["two"][1]["adagrad_plain_dense"]  # the same dense layers
    _close(runs["one"]["adagrad_plain_losses"], runs["one"]["adagrad_losses"])


@pytest.mark.parametrize("tag", ["different_ckpt_mixed", "different_ckpt_dynamic"])
def test_ranks_that_restore_different_checkpoints_are_refused(runs, tag):
    """Rank 0 loads the checkpoint after a step, rank 1 the one before it: each would train its own dense layers,
    silently (found by a probe); ``load_weights`` compares the ranks' replicated values (both model classes)."""
    for rank in (0, 1):
        error = runs["two"][rank][f"{tag}_error"]
        assert error is not None and "the ranks restored different checkpoints" in error, error
        assert "'iteration:0'" in error and "ranks [1] differ from rank 0" in error


def test_custom_loop_and_refusals(runs):
    """``htf.horovod.DistributedGradientTape`` over a packed store; what is refused, with the fix."""
    for rank in (0, 1):
        _close(runs["two"][rank]["loop_losses"], runs["one"]["loop_losses"])
        assert "Call model.save_weights(path) on every rank" in runs["two"][rank]["save_error"]
        assert "pass save_weights_only=True" in runs["two"][rank]["checkpoint_callback_error"]
        assert runs["two"][rank]["checkpoint_callback_steps"] == 0  # refused when fit starts
        assert "'early' was built before hvd.init()" in runs["two"][rank]["early_error"]
        # a static model optimized before hvd.init(): refused at compile (ranks trained their own copies)
        assert "before hvd.init()" in runs["two"][rank]["early_static_error"]
        # ranks optimizing with different settings: refused at optimize, naming the setting
        assert "differ in shard_strategy" in runs["two"][rank]["strategy_error"]
    assert runs["one"]["early_error"] is None and runs["one"]["save_error"] is None
    assert runs["one"]["early_static_error"] is None and runs["one"]["strategy_error"] is None
    assert runs["one"]["early_skipped"] == []  # packed in one process
    for rank in (0, 1):  # built before hvd.init(): not sharded, so not packed into a sharded store
        skipped = runs["two"][rank]["early_skipped"]
        assert len(skipped) == 2 and all("built before hvd.init()" in r for r in skipped)


def test_checkpoint_one_to_two_ranks(runs):
    one_dir, two_dir, _ = runs["dirs"]
    _same_tables(one_dir / "c1_1.npz", two_dir / "restored_2.npz")
    for rank in (0, 1):
        assert runs["two"][rank]["checkpoint_identical"]
        _close(runs["two"][rank]["after_restore"], runs["one"]["after_c1"])


def test_checkpoint_two_to_one_rank(runs):
    _, two_dir, back_dir = runs["dirs"]
    _same_tables(two_dir / "c2_2.npz", back_dir / "restored_1.npz")
    assert runs["back"]["checkpoint_identical"]
    _close(runs["back"]["after_restore"], runs["two"][0]["after_c2"])


@pytest.mark.parametrize(
    ("mode", "phase"), [("diverge", "checkpoint gather"), ("export_alone", "checkpoint gather (export of table")]
)
def test_ranks_that_diverge_end_with_an_error_not_a_hang(tmp_path, mode, phase):
    """Rank 1 runs fewer batches, then saves while rank 0 is in a step; or rank 0 exports alone (the export gathers
    the whole tables; it ended with Horovod's bare error before: found by a probe): both end, naming the
    collectives."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(tmp_path), mode]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", "HYBRIDTF_COLLECTIVE_TIMEOUT_S": "6"}
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-4000:]
    assert "CollectiveTimeoutError" in output or "CollectiveAbortedError" in output, output[-4000:]
    assert phase in output and "training step" in output, output[-4000:]
    assert time.time() - start < 240

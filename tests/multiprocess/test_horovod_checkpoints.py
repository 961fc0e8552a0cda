"""Keras checkpoint callbacks given to ``fit`` on every rank under ``horovodrun -np 2 --gloo``.

One launch of ``hvd_checkpoint_worker.py``:

* a model with replicated tables only, ``ModelCheckpoint`` of the whole model and of the weights on every
  rank at one path: rank 0 writes, the others' saves write nothing (said once). Before, both ranks wrote and
  one's crash-safe save removed the other's temporary file: rank 0's save failed, rank 1 waited until the
  collective timeout (found by a probe);
* sharded tables and a per-rank ``ModelCheckpoint`` path: refused at the first save on every rank, naming
  the path (rank 1's directory stayed empty, silently);
* ``BackupAndRestore`` with a directory per rank resumes a failed run as the uninterrupted run, and ranks
  that find different backups (rank 1's removed, as after a run on another number of ranks) are refused
  when ``fit`` starts, not after the collective timeout;
* a ``ModelCheckpoint(save_best_only=True)`` saving every batch of a sharded model decides on the ranks' mean
  of its monitored value, as one process would on the whole batch (before, each rank on its own: they parted
  and ended after the collective timeout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.once import computed_once

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group("test_horovod_checkpoints")]

WORKER = os.path.join(os.path.dirname(__file__), "hvd_checkpoint_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def launch(out):
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(out)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env, check=False)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    out = computed_once(tmp_path_factory, "horovod_checkpoints", launch)
    return out, [json.loads((out / f"checkpoints_{r}.json").read_text()) for r in (0, 1)]


def test_replicated_model_checkpoints_are_written_by_rank_0(runs):
    _, ranks = runs
    for result in ranks:
        assert result["replicated_error"] is None, result["replicated_error"]
        assert result["replicated_reload_diff"] == 0.0
        assert result["replicated_keras_file"]
        assert result["replicated_leftovers"] == []  # no temporary or backup files left
    assert ranks[0]["replicated_told"] == []
    [told] = ranks[1]["replicated_told"]  # once, for both callbacks and every epoch
    assert "rank 1's save" in told and "Load rank 0's path on every rank" in told


def test_a_per_rank_checkpoint_path_of_sharded_tables_is_refused_on_every_rank(runs):
    out, ranks = runs
    for rank, result in enumerate(ranks):
        error = result["per_rank_error"]
        assert error is not None and "the Horovod ranks differ in the path" in error
        assert f"rank{rank}" in error and "Give every rank the same path" in error
        assert result["per_rank_seconds"] < 60  # refused at the first save, not after a collective timeout
    for rank in (0, 1):  # nothing written under either path
        directory = out / "per_rank" / f"rank{rank}"
        assert not directory.exists() or not os.listdir(directory)


def test_backup_and_restore_resumes_as_the_uninterrupted_run(runs):
    _, ranks = runs
    for result in ranks:
        assert result["resumed_epochs"] == 1  # restored after epoch 1 (of 0, 1, 2): only epoch 2 ran
        np.testing.assert_allclose(result["resumed"], result["uninterrupted"], rtol=1e-6, atol=0)


def test_ranks_restoring_different_backups_are_refused_when_fit_starts(runs):
    _, ranks = runs
    for result in ranks:
        error = result["mismatch_error"]
        assert error is not None and "BackupAndRestore(backup_dir=" in error
        assert "found different backups" in error and "load_weights" in error
        assert result["mismatch_seconds"] < 60


def test_a_best_only_checkpoint_every_batch_decides_on_the_ranks_mean(runs):
    out, ranks = runs
    for result in ranks:
        assert result["best_error"] is None, result["best_error"]
        assert result["best_seconds"] < 60
    own = np.array([r["best_own_losses"] for r in ranks])  # each rank's running mean of its batches' losses
    assert own.shape == (2, 6) and not np.allclose(own[0], own[1])  # the ranks' own logs differ
    mean = own.mean(axis=0)
    assert ranks[0]["best_value"] == ranks[1]["best_value"]
    np.testing.assert_allclose(ranks[0]["best_value"], mean.min(), rtol=1e-6)
    assert (out / "best" / "w.index").exists()


def test_a_sharded_tables_view_reads_by_index_and_writes_rows_on_every_rank(runs):
    _, ranks = runs
    for result in ranks:
        before = np.array(result["view_before"], np.float32)
        np.testing.assert_array_equal(result["view_row7"], before[7])
        expected = before.copy()
        expected[[0, 199]] = 1.0
        expected[[0, 5]] += 2.0
        expected[150] -= 1.0
        expected += 0.5
        np.testing.assert_array_equal(np.array(result["view_after"], np.float32), expected)
        assert "sharded over the Horovod ranks" in result["view_sliced_write"]
    assert ranks[0]["view_after"] == ranks[1]["view_after"]

"""Interleaving under ``horovodrun -np 2 -H localhost:2 --gloo`` equals one process.

Micro-batched steps (2 micro-batches, from the embedding layer and from the
MLP) and K-interleaving groups (alltoalls of group 1 after group 0's, on both
ranks) of a W&D model, and a custom ``htf.function`` loop with
``htf.micro_batch_gradients`` + ``htf.horovod.average_gradients``, and a micro-batched model compiled with
``hvd.DistributedOptimizer``: the ranks' mean per-step losses equal the one-process
losses on the global batches within 1e-5 relative. An invalid id on one rank,
in the second micro-batch of a grouped step, fails the step on both ranks.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tests.multiprocess.test_horovod import _run
from tests.once import computed_once

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group("test_horovod_interleave")]

WORKER = os.path.join(os.path.dirname(__file__), "hvd_interleave_worker.py")
KEYS = ["micro_embedding", "micro_mlp", "groups", "groups_micro", "groups_auto", "micro_hvd_optimizer", "custom_micro"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def launch_all(out):
        _run([sys.executable, WORKER, str(out)])
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        _run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, str(out)])

    out = computed_once(tmp_path_factory, "horovod_interleave", launch_all)

    def load(size, rank):
        with open(out / f"interleave_{size}_{rank}.json") as f:
            return json.load(f)

    return load(1, 0), [load(2, 0), load(2, 1)]


@pytest.mark.parametrize("key", KEYS)
def test_two_ranks_equal_one_process(runs, key):
    single, ranks = runs
    losses = np.array(single[key])
    assert len(losses) > 0 and np.all(np.isfinite(losses))
    np.testing.assert_allclose(np.mean([r[key] for r in ranks], axis=0), losses, rtol=1e-5, atol=0)
    assert not np.allclose(ranks[0][key], ranks[1][key])  # the ranks saw different halves


def test_auto_groups_are_the_same_on_every_rank(runs):
    _, ranks = runs
    assert ranks[0]["groups_auto_groups"] == ranks[1]["groups_auto_groups"]
    assert len(ranks[0]["groups_auto_groups"]) == 2  # a tiny Capacity_g: one chain per group


def test_interleaving_does_not_change_the_losses(runs):
    single, _ = runs
    for key in KEYS[1:-1]:  # custom_micro: another loop (plain Keras optimizer), compared across ranks above
        np.testing.assert_allclose(single[key], single["micro_embedding"], rtol=1e-5, atol=0)


def test_invalid_id_in_an_interleaved_step_fails_every_rank(runs):
    _, ranks = runs
    for r in ranks:
        message = r["invalid_error"]
        assert message is not None, f"rank {r['rank']} trained on despite rank 1's invalid id"
        assert "on at least one rank" in message

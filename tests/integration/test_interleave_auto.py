"""``"auto"`` interleaving: Eq. 2 and Eq. 3 from hybridtf's own warm-up measurements.

The first two training steps run whole and un-interleaved; the second is
measured (allocator peak memory, profiler op times per packed chain). The plan
then shows where its numbers came from, follows Eq. 2 / Eq. 3 exactly, and
training stays exact: losses equal the plain optimized model's within 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

import hybridtf as htf
from tests.integration.test_micro_batch import _batches, wide_and_deep

BATCH = 8192
STEPS = 5


def _run(batches, **options):
    model = wide_and_deep()
    model(batches[0][0])
    model = htf.keras.optimize(model, **options)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches]), model


def test_auto_micro_batches_and_groups_follow_eq2_eq3():
    batches = _batches(STEPS, batch=BATCH, seed=3)
    whole, _ = _run(batches)
    roomy, model = _run(batches, micro_batches="auto", micro_batch_memory=1e12)
    micro = model.hybridtf_interleaving.micro
    assert micro.source == "eq2" and micro.batch_size == BATCH and micro.peak_bytes > 0
    assert (micro.micro_batch_size, micro.num_micro_batches) == (BATCH, 1)  # everything fits
    np.testing.assert_allclose(roomy, whole, rtol=1e-5, atol=0)

    # A sixteenth of the first run's measured peak. The second run measures its own step (the process's resident
    # memory): allocator pools the first run left behind make it smaller, by more than half on a loaded machine
    # and once 8.3x (CI, 2026-11-28: 9.45 MB then 1.14 MB), so the bound leaves room for that and still asks for
    # several micro-batches (16 when both measure the same).
    bound = micro.peak_bytes / 16
    first_peak = micro.peak_bytes
    tight, model = _run(batches, micro_batches="auto", micro_batch_memory=bound, interleave_from="mlp")
    plan = model.hybridtf_interleaving
    micro = plan.micro
    assert micro.interleave_from == "mlp" and micro.memory_bound == bound
    assert micro.micro_batch_size == min(BATCH, int(bound // (micro.peak_bytes / BATCH)))  # Eq. 2
    assert micro.num_micro_batches == math.ceil(BATCH / micro.micro_batch_size) >= 2, (first_peak, micro.peak_bytes)
    assert "Eq. 2" in str(plan)
    np.testing.assert_allclose(tight, whole, rtol=1e-5, atol=0)


def test_auto_groups_from_measured_chain_times():
    batches = _batches(STEPS, batch=256, seed=4)
    plain, _ = _run(batches)
    grouped, model = _run(batches, interleave_groups="auto", interleave_scale=1e-6)
    plan = model.hybridtf_interleaving
    assert plan.source == "eq3" and plan.bounds["seconds"] > 0
    assert all(c.costs["seconds"] > 0 and c.params > 0 for c in plan.chains)
    # Capacity_g = RBound / RParam with RParam = measured seconds per parameter (Eq. 3), scaled
    rparam = sum(c.costs["seconds"] for c in plan.chains) / sum(c.params for c in plan.chains)
    assert math.isclose(plan.capacity, plan.bounds["seconds"] / rparam * 1e-6, rel_tol=1e-9)
    assert plan.num_groups == len(plan.chains) == 2  # a tiny capacity: one chain per group
    assert (
        model._htf_runtime.interleaving is plan.with_micro(None)
        or model._htf_runtime.interleaving.groups == plan.groups
    )
    np.testing.assert_array_equal(grouped, plain)

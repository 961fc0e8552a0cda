"""HybridTF>StitchConcatMatMul (+ its gradient op) vs tf.matmul of StitchConcat; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat, stitch_concat_matmul
from tests.ops.test_stitch_concat import _stitch_groups, concat_cases

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _reference(groups, dense, pieces, kernel):
    return tf.matmul(stitch_concat(groups, dense, pieces), kernel)


def _kernel(rng, groups, dense, pieces, units):
    width = sum(int(groups[g].rows.shape[1]) if g >= 0 else int(dense[f].shape[1]) for g, f in pieces)
    return tf.constant(rng.standard_normal((width, units)).astype(np.float32))


def _compare(groups, dense, pieces, kernel, rtol=2e-5, atol=2e-5):
    """Forward and every gradient (rows, dense, kernel) of the fused op vs the reference."""
    sources = [g.rows for g in groups] + list(dense) + [kernel]
    results = []
    for fn in (stitch_concat_matmul, _reference):
        with tf.GradientTape() as tape:
            tape.watch(sources)
            out = fn(groups, dense, pieces, kernel)
            upstream = tf.reshape(tf.sin(tf.range(tf.size(out), dtype=tf.float32)), tf.shape(out))
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        results.append([out.numpy()] + [tf.convert_to_tensor(g).numpy() for g in grads])
    for fused, ref in zip(*results):
        assert fused.shape == ref.shape
        np.testing.assert_allclose(fused, ref, rtol=rtol, atol=atol)


@SETTINGS
@given(concat_cases(), st.sampled_from([1, 5, 16, 64]), st.integers(0, 2**31 - 1))
def test_forward_and_gradients_equal_matmul_of_stitch_concat(case, units, seed):
    batch, groups, dense_np, pieces = case
    sg = _stitch_groups(groups, batch)
    dense = [tf.constant(d) for d in dense_np]
    _compare(sg, dense, pieces, _kernel(np.random.default_rng(seed), sg, dense, pieces, units))


def _zipf_group(rng, batch, fields, per_table, dim, combiners, shared=False):
    """Sorted-unique-like layout: field f reads its own contiguous row range (or all read one range if shared)."""
    inverse, sizes, segments, lengths = [], [], [], []
    for f, combiner in enumerate(combiners[:fields]):
        n = batch
        if combiner != "none":
            bag = rng.integers(0, 4, size=batch)
            lengths.extend(bag.tolist())
            n = int(bag.sum())
        local = rng.zipf(1.3, size=n).clip(1, per_table) - 1
        inverse.append(local + (0 if shared else f * per_table))
        sizes.append(n)
        segments.append(n if combiner == "none" else batch)
    num_rows = per_table * (1 if shared else fields)
    return StitchGroup(
        tf.constant(rng.standard_normal((num_rows, dim)).astype(np.float32)),
        tf.constant(np.concatenate(inverse).astype(np.int32)),
        tf.constant(sizes, tf.int64),
        tf.constant(segments, tf.int64),
        tf.constant(lengths, tf.int64),
        tuple(combiners[:fields]),
    )


@pytest.mark.parametrize("shared", [False, True], ids=["own-tables", "shared-table"])
@pytest.mark.parametrize("units", [64, 7])
def test_projected_fields_zipf_layout(shared, units):
    """Fields that read short distinct-row ranges (projected once per row), one-hot and bags, two groups."""
    rng = np.random.default_rng(3)
    batch = 300
    groups = [
        _zipf_group(rng, batch, 4, 50, 8, ["none", "sum", "none", "mean"], shared),
        _zipf_group(rng, batch, 3, 40, 16, ["sqrtn", "none", "none"], shared),
    ]
    dense = [tf.constant(rng.standard_normal((batch, 13)).astype(np.float32))]
    pieces = [(0, 0), (1, 0), (-1, 0), (0, 1), (1, 2), (0, 3), (1, 1), (0, 2)]
    _compare(groups, dense, pieces, _kernel(rng, groups, dense, pieces, units))


def test_deterministic_and_unused_rows_get_zero_gradient():
    rng = np.random.default_rng(4)
    group = _zipf_group(rng, 200, 3, 1000, 8, ["none"] * 3)  # most of each range is never read
    kernel = _kernel(rng, [group], [], [(0, 0), (0, 1), (0, 2)], 32)
    runs = []
    for _ in range(2):
        with tf.GradientTape() as tape:
            tape.watch(group.rows)
            out = stitch_concat_matmul([group], [], [(0, 0), (0, 1), (0, 2)], kernel)
        runs.append((out.numpy(), tape.gradient(out, group.rows).numpy()))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    read = np.zeros(3000, bool)
    read[np.unique(group.inverse.numpy())] = True
    assert np.all(runs[0][1][~read] == 0) and np.any(runs[0][1][read] != 0)


def _one_group(batch=4, dim=3):
    rows = tf.constant(np.arange(5 * dim, dtype=np.float32).reshape(5, dim))
    sizes = tf.constant([batch], tf.int64)
    inverse = tf.constant([0, 4, 2, 1][:batch], tf.int32)
    return StitchGroup(rows, inverse, sizes, sizes, tf.zeros([0], tf.int64), ("none",))


def test_kernel_rows_must_match_width():
    group = _one_group()
    dense = tf.ones([4, 2])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="kernel"):
        stitch_concat_matmul([group], [dense], [(0, 0), (-1, 0)], tf.ones([4, 8]))


@pytest.mark.parametrize("bad_index", [9, 5, -1])
def test_inverse_out_of_range_is_invalid_argument(bad_index):
    group = _one_group()
    bad = StitchGroup(group.rows, tf.constant([0, bad_index, 2, 1], tf.int64), *list(vars(group).values())[2:])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"field 0: an inverse index is outside \[0, 5\)"):
        stitch_concat_matmul([bad], [], [(0, 0)], tf.ones([3, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="inverse index is outside"):
        with tf.GradientTape() as tape:
            tape.watch(group.rows)
            out = stitch_concat_matmul([group], [], [(0, 0)], tf.ones([3, 2]))
        load_ops().hybrid_tf_stitch_concat_mat_mul_grad(
            tf.ones_like(out),
            tf.ones([3, 2]),
            [bad.rows],
            [bad.inverse],
            [bad.field_sizes],
            [bad.field_segments],
            [bad.segment_lengths],
            [],
            group_fields=[1],
            combiners=["none"],
            piece_groups=[0],
            piece_items=[0],
        )


def test_grad_op_rejects_wrong_grad_shape():
    group = _one_group()
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must have shape"):
        load_ops().hybrid_tf_stitch_concat_mat_mul_grad(
            tf.ones([4, 3]),
            tf.ones([3, 2]),
            [group.rows],
            [group.inverse],
            [group.field_sizes],
            [group.field_segments],
            [group.segment_lengths],
            [],
            group_fields=[1],
            combiners=["none"],
            piece_groups=[0],
            piece_items=[0],
        )

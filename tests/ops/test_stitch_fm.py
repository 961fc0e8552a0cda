"""HybridTF>StitchFM (+ its gradient op) vs the FM cross term of StitchConcat's stacked fields; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat
from hybridtf._src.run.stitch_fm import fm_of_stitch_concat
from tests.ops.test_stitch_concat_matmul import _one_group, _zipf_group

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def _fused(groups, pieces):
    """StitchFM on the groups' rows (traced: the op is built from a StitchConcat op of the graph)."""

    @tf.function
    def fm(*rows):
        traced = [StitchGroup(r, *list(vars(g).values())[1:]) for r, g in zip(rows, groups)]
        return fm_of_stitch_concat(stitch_concat(traced, [], pieces).op)

    return fm(*[g.rows for g in groups])


def _reference(groups, pieces):
    dim = int(groups[0].rows.shape[1])
    x = tf.reshape(stitch_concat(groups, [], pieces), [-1, len(pieces), dim])
    return tf.square(tf.reduce_sum(x, axis=1)) - tf.reduce_sum(x * x, axis=1)


def _compare(groups, pieces, rtol=1e-5, atol=1e-5):
    sources = [g.rows for g in groups]
    results = []
    for fn in (_fused, _reference):
        with tf.GradientTape() as tape:
            tape.watch(sources)
            out = fn(groups, pieces)
            upstream = tf.reshape(tf.sin(tf.range(tf.size(out), dtype=out.dtype)), tf.shape(out))
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        results.append([out.numpy()] + [tf.convert_to_tensor(g).numpy() for g in grads])
    for fused, ref in zip(*results):
        assert fused.shape == ref.shape
        np.testing.assert_allclose(fused, ref, rtol=rtol, atol=atol)


@st.composite
def fm_cases(draw):
    """1-2 groups of one dim, one-hot and bag fields (own or shared row ranges), pieces in any order."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    batch = draw(st.integers(1, 40))
    dim = draw(st.sampled_from([1, 3, 8, 16]))
    groups = []
    for _ in range(draw(st.integers(1, 2))):
        fields = draw(st.integers(1, 4))
        combiners = draw(st.lists(st.sampled_from(["none", "none", "sum", "mean", "sqrtn"]), min_size=4, max_size=4))
        groups.append(_zipf_group(rng, batch, fields, 20, dim, combiners, shared=draw(st.booleans())))
    pieces = [(g, f) for g, group in enumerate(groups) for f in range(len(group.combiners))]
    order = draw(st.permutations(range(len(pieces))))
    return groups, [pieces[i] for i in order]


@SETTINGS
@given(fm_cases())
def test_forward_and_gradient_equal_fm_of_stacked_fields(case):
    groups, pieces = case
    _compare(groups, pieces)


def test_float64_and_int64_inverse():
    rng = np.random.default_rng(1)
    g = _zipf_group(rng, 50, 3, 30, 4, ["none", "mean", "none"])
    g64 = StitchGroup(tf.cast(g.rows, tf.float64), tf.cast(g.inverse, tf.int64), *list(vars(g).values())[2:])
    _compare([g64], [(0, 2), (0, 0), (0, 1)], rtol=1e-12, atol=1e-12)


def test_deterministic_and_unread_rows_get_zero_gradient():
    rng = np.random.default_rng(4)
    group = _zipf_group(rng, 300, 3, 1000, 8, ["none"] * 3)
    pieces = [(0, 0), (0, 1), (0, 2)]
    runs = []
    for _ in range(2):
        with tf.GradientTape() as tape:
            tape.watch(group.rows)
            out = _fused([group], pieces)
        runs.append((out.numpy(), tape.gradient(out, group.rows).numpy()))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    read = np.zeros(3000, bool)
    read[np.unique(group.inverse.numpy())] = True
    assert np.all(runs[0][1][~read] == 0) and np.any(runs[0][1][read] != 0)


def _raw(op, group, *, grad=None, sums=None, dense=(), inverse=None, rows=None, groups=1, pieces=((0, 0),)):
    lists = [
        [rows if rows is not None else group.rows] * groups,
        [inverse if inverse is not None else group.inverse] * groups,
        [group.field_sizes] * groups,
        [group.field_segments] * groups,
        [group.segment_lengths] * groups,
        list(dense),
    ]
    attrs = dict(
        group_fields=[1] * groups,
        combiners=["none"] * groups,
        piece_groups=[p[0] for p in pieces],
        piece_items=[p[1] for p in pieces],
    )
    if op == "grad":
        return load_ops().hybrid_tf_stitch_fm_grad(grad, grad if sums is None else sums, grad, *lists, **attrs)
    return load_ops().hybrid_tf_stitch_fm(*lists, **attrs)


@pytest.mark.parametrize("op", ["forward", "grad"])
def test_dense_piece_is_invalid_argument(op):
    group = _one_group()
    with pytest.raises(tf.errors.InvalidArgumentError, match="embedding fields only"):
        _raw(op, group, grad=tf.ones([4, 3]), dense=[tf.ones([4, 3])], pieces=((0, 0), (-1, 0)))


def test_fields_of_different_dims_are_invalid_argument():
    group = _one_group(dim=3)
    other = _one_group(dim=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="same embedding dim"):
        load_ops().hybrid_tf_stitch_fm(
            [group.rows, other.rows],
            [group.inverse, other.inverse],
            [group.field_sizes] * 2,
            [group.field_segments] * 2,
            [group.segment_lengths] * 2,
            [],
            group_fields=[1, 1],
            combiners=["none", "none"],
            piece_groups=[0, 1],
            piece_items=[0, 0],
        )


@pytest.mark.parametrize("op", ["forward", "grad"])
@pytest.mark.parametrize("bad_index", [9, 5, -1])
def test_inverse_out_of_range_is_invalid_argument(op, bad_index):
    group = _one_group()
    bad = tf.constant([0, bad_index, 2, 1], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="inverse"):
        _raw(op, group, grad=tf.ones([4, 3]), inverse=bad)


def test_grad_op_rejects_wrong_grad_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must have shape"):
        _raw("grad", _one_group(), grad=tf.ones([4, 2]))


@pytest.mark.parametrize("shape", [[4, 2], [3, 3], [12]])
def test_grad_op_rejects_wrong_sums_shape(shape):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"sums must have shape|Shape"):
        _raw("grad", _one_group(), grad=tf.ones([4, 3]), sums=tf.ones(shape))


def test_second_output_is_the_field_sum_and_feeds_the_gradient():
    """StitchFM's ``sums`` output is sum_f e_f (what its gradient takes back instead of re-reading the rows)."""
    rng = np.random.default_rng(7)
    group = _zipf_group(rng, 64, 4, 50, 8, ["none", "sum", "none", "mean"])
    pieces = [(0, 3), (0, 0), (0, 2), (0, 1)]
    concat = stitch_concat([group], [], pieces)
    lists = [[group.rows], [group.inverse], [group.field_sizes], [group.field_segments], [group.segment_lengths], []]
    attrs = dict(group_fields=[4], combiners=list(group.combiners), piece_groups=[0] * 4, piece_items=[3, 0, 2, 1])
    out, sums = load_ops().hybrid_tf_stitch_fm(*lists, **attrs)
    x = tf.reshape(concat, [-1, 4, 8])
    np.testing.assert_allclose(sums.numpy(), tf.reduce_sum(x, axis=1).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), _reference([group], pieces).numpy(), rtol=1e-5, atol=1e-5)


def test_gradient_through_both_outputs():
    """A loss reading the cross term and the sums output: both gradients reach the rows (vs the stacked math)."""
    rng = np.random.default_rng(9)
    group = _zipf_group(rng, 32, 3, 40, 8, ["none", "mean", "none"])
    pieces = [(0, 0), (0, 1), (0, 2)]
    lists = [[group.rows], [group.inverse], [group.field_sizes], [group.field_segments], [group.segment_lengths], []]
    attrs = dict(group_fields=[3], combiners=list(group.combiners), piece_groups=[0] * 3, piece_items=[0, 1, 2])
    weights = tf.reshape(tf.cos(tf.range(32 * 8, dtype=tf.float32)), [32, 8])
    results = []
    for fused in (True, False):
        with tf.GradientTape() as tape:
            tape.watch(group.rows)
            if fused:
                out, sums = load_ops().hybrid_tf_stitch_fm(*lists, **attrs)
            else:
                x = tf.reshape(stitch_concat([group], [], pieces), [-1, 3, 8])
                sums = tf.reduce_sum(x, axis=1)
                out = tf.square(sums) - tf.reduce_sum(x * x, axis=1)
            loss = tf.reduce_sum(out * weights) + tf.reduce_sum(sums * weights * 3.0)
        results.append(tape.gradient(loss, group.rows).numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)

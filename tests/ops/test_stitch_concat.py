"""HybridTF>StitchConcat (+ its gradient op) vs tf.concat of StitchCombine outputs; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybridtf as htf
from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def concat_cases(draw):
    """Groups of one-hot and bag fields with `batch` output rows each, dense inputs, and a random placement."""
    batch = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        dim = draw(st.sampled_from([1, 3, 8, 16, 20]))
        num_unique = draw(st.integers(1, 30))
        combiners, sizes, lengths = [], [], []
        for _ in range(draw(st.integers(1, 4))):
            combiner = draw(st.sampled_from(["none", "sum", "mean", "sqrtn"]))
            combiners.append(combiner)
            if combiner == "none":
                sizes.append(batch)
            else:
                bag = rng.integers(0, 5, size=batch).tolist()
                lengths.extend(bag)
                sizes.append(sum(bag))
        rows = rng.standard_normal((num_unique, dim)).astype(np.float32)
        inverse = rng.integers(0, num_unique, size=sum(sizes)).astype(index_dtype)
        groups.append((rows, inverse, combiners, sizes, lengths))
    dense = [rng.standard_normal((batch, w)).astype(np.float32) for w in draw(st.lists(st.integers(1, 5), max_size=2))]
    slots = [(g, f) for g, grp in enumerate(groups) for f in range(len(grp[2]))]
    chosen = draw(st.lists(st.sampled_from(slots), min_size=1, max_size=len(slots), unique=True))
    pieces = chosen + [(-1, m) for m in range(len(dense))]
    order = draw(st.permutations(range(len(pieces))))
    return batch, groups, dense, [pieces[i] for i in order]


def _stitch_groups(groups, batch):
    out = []
    for rows, inverse, combiners, sizes, lengths in groups:
        segments = [s if c == "none" else batch for c, s in zip(combiners, sizes)]
        out.append(
            StitchGroup(
                tf.constant(rows),
                tf.constant(inverse),
                tf.constant(sizes, tf.int64),
                tf.constant(segments, tf.int64),
                tf.constant(lengths, tf.int64),
                tuple(combiners),
            )
        )
    return out


def _unfused(stitch_groups, dense, pieces):
    outs = [
        htf.ops.stitch_combine(
            g.rows,
            g.inverse,
            g.field_sizes,
            g.combiners,
            field_segments=g.field_segments,
            segment_lengths=g.segment_lengths,
        )
        for g in stitch_groups
    ]
    return tf.concat([outs[g][f] if g >= 0 else dense[f] for g, f in pieces], axis=-1)


@SETTINGS
@given(concat_cases())
def test_forward_equals_concat_of_stitch_combine(case):
    batch, groups, dense_np, pieces = case
    sg = _stitch_groups(groups, batch)
    dense = [tf.constant(d) for d in dense_np]
    fused = stitch_concat(sg, dense, pieces)
    np.testing.assert_array_equal(fused.numpy(), _unfused(sg, dense, pieces).numpy())


@SETTINGS
@given(concat_cases())
def test_gradient_equals_unfused_gradient(case):
    batch, groups, dense_np, pieces = case
    sg = _stitch_groups(groups, batch)
    dense = [tf.constant(d) for d in dense_np]
    sources = [g.rows for g in sg] + dense
    results = []
    for fn in (stitch_concat, _unfused):
        with tf.GradientTape() as tape:
            tape.watch(sources)
            out = fn(sg, dense, pieces)
            upstream = tf.reshape(tf.sin(tf.range(tf.size(out), dtype=tf.float32)), tf.shape(out))
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        results.append([tf.convert_to_tensor(g).numpy() for g in grads])
    for fused, ref in zip(*results):
        np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims", [(8, 16), (1, 4)])  # rows added row by row / column by column
def test_gradient_order_equals_stitch_combine_grad_bitwise(dims):
    """One field per table (the usual case): the same summation order as the unfused gradient.

    Zipf ids leave rows no position reaches, inside and between the fields' ranges: their gradient is 0.
    """
    rng = np.random.default_rng(5)
    batch = 512
    sg, dense = [], [tf.constant(rng.standard_normal((batch, 13)).astype(np.float32))]
    for d in dims:
        u = 300
        rows = tf.constant(rng.standard_normal((u, d)).astype(np.float32))
        per_table = u // 4  # field f looks up its own table: rows [f * per_table, (f + 1) * per_table)
        local = rng.zipf(1.2, size=(4, batch)).clip(1, per_table) - 1
        inverse = tf.constant((local + per_table * np.arange(4)[:, None]).reshape(-1).astype(np.int32))
        sizes = tf.constant([batch] * 4, tf.int64)
        sg.append(StitchGroup(rows, inverse, sizes, sizes, tf.zeros([0], tf.int64), ("none",) * 4))
    pieces = [(f % 2, f // 2) for f in range(8)] + [(-1, 0)]
    sources = [g.rows for g in sg]
    results = []
    for fn in (stitch_concat, _unfused):
        with tf.GradientTape() as tape:
            tape.watch(sources)
            out = fn(sg, dense, pieces)
            loss = tf.reduce_sum(out * tf.cos(tf.reshape(tf.range(tf.size(out), dtype=tf.float32), tf.shape(out))))
        results.append([g.numpy() for g in tape.gradient(loss, sources)])
    for fused, ref in zip(*results):
        np.testing.assert_array_equal(fused, ref)


@SETTINGS
@given(concat_cases(), st.booleans())
def test_gradient_of_a_summed_concat_reads_one_column(case, static_batch):
    """reduce_sum over the columns: the gradient op reads the [B, 1] column (Tile / BroadcastTo skipped).

    Bit for bit what it gives for the same gradient given as a full [B, W] matrix. With the dense
    inputs as arguments of unknown batch, the sum's gradient is a BroadcastTo, else a Tile.
    """
    batch, groups, dense_np, pieces = case
    sg = _stitch_groups(groups, batch)
    weight = tf.reshape(tf.sin(tf.range(batch, dtype=tf.float32)), [batch, 1])

    def grads(dense, summed: bool):
        sources = [g.rows for g in sg] + list(dense)
        with tf.GradientTape() as tape:
            tape.watch(sources)
            out = stitch_concat(sg, dense, pieces)
            if summed:
                loss = tf.reduce_sum(tf.reduce_sum(out, axis=-1, keepdims=True) * weight)
            else:  # the same gradient values, as a [B, W] matrix (a Mul, not a broadcast)
                loss = tf.reduce_sum(out * tf.tile(weight, [1, out.shape[1]]))
        return tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    spec = [tf.TensorSpec([batch if static_batch else None, d.shape[1]], tf.float32) for d in dense_np]
    fns = {summed: tf.function(lambda *d, summed=summed: grads(d, summed), input_signature=spec) for summed in (1, 0)}
    flags = [
        op.get_attr("broadcast_grad")
        for op in fns[1].get_concrete_function().graph.get_operations()
        if op.type == "HybridTF>StitchConcatGrad"
    ]
    assert flags == [True]
    dense = [tf.constant(d) for d in dense_np]
    for got, ref in zip(fns[1](*dense), fns[0](*dense)):
        np.testing.assert_array_equal(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(ref).numpy())


def _raw_grad(grad, inverse, num_unique, broadcast=False):
    sizes = tf.constant([int(inverse.shape[0])], tf.int64)
    return load_ops().hybrid_tf_stitch_concat_grad(
        grad,
        [inverse],
        [sizes],
        [sizes],
        [tf.zeros([0], tf.int64)],
        [tf.constant(num_unique, tf.int64)],
        group_fields=[1],
        combiners=["none"],
        piece_groups=[0],
        piece_items=[0],
        dims=[2],
        dense_widths=[],
        num_dense=0,
        broadcast_grad=broadcast,
    )


def test_broadcast_gradient_must_be_one_column():
    with pytest.raises(tf.errors.InvalidArgumentError, match="broadcast_grad"):
        _raw_grad(tf.ones([2, 2]), tf.constant([0, 1]), 3, broadcast=True)
    d_rows, *_ = _raw_grad(tf.constant([[1.0], [2.0]]), tf.constant([0, 0]), 3, broadcast=True)
    np.testing.assert_array_equal(d_rows[0].numpy(), [[3, 3], [0, 0], [0, 0]])


@pytest.mark.parametrize("bad", [7, -1])
def test_gradient_inverse_out_of_range(bad):
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"inverse\[1\] = {bad} is out of range \[0, 3\)"):
        _raw_grad(tf.ones([2, 2]), tf.constant([0, bad]), 3)


def test_graph_mode_static_width_and_dynamic_batch():
    rows = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    group_sizes = tf.constant([2, 2], tf.int64)
    group = StitchGroup(
        rows, tf.constant([3, 0, 1, 1]), group_sizes, group_sizes, tf.zeros([0], tf.int64), ("none", "none")
    )

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def fn(dense):
        return stitch_concat([group], [dense], [(0, 1), (-1, 0), (0, 0)])

    out = fn(tf.ones([2, 2]))
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None, 8]
    np.testing.assert_array_equal(out.numpy(), [[3, 4, 5, 1, 1, 9, 10, 11], [3, 4, 5, 1, 1, 0, 1, 2]])


def _raw(rows, inverse, dense, pieces, combiners=("none",), sizes=(2,), segments=None, lengths=()):
    return load_ops().hybrid_tf_stitch_concat(
        [rows],
        [inverse],
        [tf.constant(list(sizes), tf.int64)],
        [tf.constant(list(segments or sizes), tf.int64)],
        [tf.constant(list(lengths), tf.int64)],
        dense,
        group_fields=[len(combiners)],
        combiners=list(combiners),
        piece_groups=[p[0] for p in pieces],
        piece_items=[p[1] for p in pieces],
    )


def test_pieces_with_different_row_counts_are_an_error():
    rows = tf.ones([3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="same number of rows"):
        _raw(rows, tf.constant([0, 1]), [tf.ones([3, 1])], [(0, 0), (-1, 0)])


def test_invalid_pieces_are_errors():
    rows, inverse = tf.ones([3, 2]), tf.constant([0, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not exist or is already used"):
        _raw(rows, inverse, [], [(0, 0), (0, 0)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not exist"):
        _raw(rows, inverse, [], [(0, 1)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly once"):
        _raw(rows, inverse, [tf.ones([2, 1])], [(0, 0), (-1, 0), (-1, 0)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="is not placed"):
        _raw(rows, inverse, [tf.ones([2, 1])], [(0, 0)])


def test_inverse_out_of_range_and_bad_layout():
    rows = tf.ones([3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        _raw(rows, tf.constant([0, 7]), [], [(0, 0)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="field_sizes sum to"):
        _raw(rows, tf.constant([0, 1, 2]), [], [(0, 0)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="bag lengths"):
        _raw(rows, tf.constant([0, 1]), [], [(0, 0)], combiners=("sum",), sizes=(2,), segments=(2,), lengths=(1, 2))


def test_python_errors():
    group = StitchGroup(
        tf.ones([3, 2]),
        tf.constant([0, 1]),
        tf.constant([2], tf.int64),
        tf.constant([2], tf.int64),
        tf.zeros([0], tf.int64),
        ("none",),
    )
    with pytest.raises(ValueError, match="at least one group"):
        stitch_concat([], [], [])

    @tf.function(input_signature=[tf.TensorSpec([2, None], tf.float32)])
    def unknown_width(dense):
        return stitch_concat([group], [dense], [(0, 0), (-1, 0)])

    with pytest.raises(ValueError, match="static width"):
        unknown_width.get_concrete_function()

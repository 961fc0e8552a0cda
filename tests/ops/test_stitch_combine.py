"""HybridTF>StitchCombine (+ its gradient op) vs a plain-TF composition; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybridtf as htf
from hybridtf._src.run.loader import load_ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def layouts(draw):
    """Random fields (one-hot and bags, empty and all-single-id bags included), rows, inverse and optional weights."""
    num_fields = draw(st.integers(1, 6))
    dim = draw(st.sampled_from([1, 3, 8, 16]))
    num_unique = draw(st.integers(1, 40))
    combiners, sizes, segments, lengths = [], [], [], []
    for _ in range(num_fields):
        combiner = draw(st.sampled_from(["none", "sum", "mean", "sqrtn"]))
        combiners.append(combiner)
        if combiner == "none":
            n = draw(st.integers(0, 30))
            sizes.append(n)
            segments.append(n)
        else:
            if draw(st.booleans()):  # every bag one id (the kernel's copy path when unweighted)
                bag_lengths = [1] * draw(st.integers(0, 12))
            else:
                bag_lengths = draw(st.lists(st.integers(0, 6), min_size=0, max_size=12))
            lengths.extend(bag_lengths)
            sizes.append(sum(bag_lengths))
            segments.append(len(bag_lengths))
    n = sum(sizes)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((num_unique, dim)).astype(np.float32)
    inverse = rng.integers(0, num_unique, size=n).astype(draw(st.sampled_from([np.int32, np.int64])))
    weights = rng.uniform(0.1, 2.0, size=n).astype(np.float32) if draw(st.booleans()) else None
    return rows, inverse, combiners, sizes, segments, lengths, weights


def reference(rows, inverse, combiners, sizes, segments, lengths, weights):
    """The same outputs from stock TF ops: gather, then per-field ragged reduction."""
    gathered = tf.gather(rows, inverse)
    w = None if weights is None else tf.constant(weights)
    outs, pos, cursor = [], 0, 0
    for f, combiner in enumerate(combiners):
        part = gathered[pos : pos + sizes[f]]
        if combiner == "none":
            outs.append(part)
        else:
            bag_lengths = lengths[cursor : cursor + segments[f]]
            cursor += segments[f]
            pw = tf.ones([sizes[f]], rows.dtype) if w is None else w[pos : pos + sizes[f]]
            summed = tf.reduce_sum(tf.RaggedTensor.from_row_lengths(part * pw[:, None], bag_lengths), axis=1)
            if combiner == "sum":
                outs.append(summed)
            else:
                wr = tf.RaggedTensor.from_row_lengths(pw if combiner == "mean" else pw * pw, bag_lengths)
                denom = tf.reduce_sum(wr, axis=1)
                denom = denom if combiner == "mean" else tf.sqrt(denom)
                outs.append(tf.math.divide_no_nan(summed, denom[:, None]))
        pos += sizes[f]
    return outs


def run_fused(rows, inverse, combiners, sizes, segments, lengths, weights):
    return htf.ops.stitch_combine(
        rows, inverse, sizes, combiners, field_segments=segments, segment_lengths=lengths, weights=weights
    )


@SETTINGS
@given(layouts())
def test_forward_matches_reference(case):
    fused = run_fused(*case)
    ref = reference(*case)
    assert len(fused) == len(ref)
    for a, b in zip(fused, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@SETTINGS
@given(layouts())
def test_gradient_matches_reference(case):
    rows = tf.constant(case[0])
    probes = [tf.random.stateless_normal(tf.shape(r), seed=[i, 7]) for i, r in enumerate(reference(*case))]

    def loss(fn, r):
        return tf.add_n([tf.reduce_sum(o * p) for o, p in zip(fn(r, *case[1:]), probes)] + [tf.constant(0.0)])

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(rows)
        fused_loss = loss(run_fused, rows)
        ref_loss = loss(reference, rows)
    g_fused = tf.convert_to_tensor(tape.gradient(fused_loss, rows))
    g_ref = tf.convert_to_tensor(tape.gradient(ref_loss, rows))
    np.testing.assert_allclose(g_fused.numpy(), g_ref.numpy(), rtol=1e-5, atol=1e-5)


def test_numeric_gradient_float64():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((5, 3))
    inverse = np.array([0, 4, 2, 2, 1, 3, 0, 4])
    weights = rng.uniform(0.5, 1.5, size=8)

    def fn(r):
        outs = htf.ops.stitch_combine(
            r,
            inverse,
            [2, 3, 3],
            ["none", "mean", "sqrtn"],
            field_segments=[2, 2, 2],
            segment_lengths=[1, 2, 3, 0],
            weights=weights,
        )
        return tf.concat(outs, axis=0)

    theoretical, numerical = tf.test.compute_gradient(fn, [tf.constant(rows)])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


def test_graph_mode_and_static_shapes():
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32)])
    def fn(rows, inverse):
        outs = htf.ops.stitch_combine(rows, inverse, [3], ["none"])
        assert outs[0].shape.as_list() == [None, 4]
        return outs[0]

    out = fn(tf.eye(4), tf.constant([3, 0, 3]))
    np.testing.assert_array_equal(out.numpy(), np.eye(4)[[3, 0, 3]])


def test_empty_bags_and_zero_weight_bags_give_zero_rows():
    rows = tf.ones([2, 2])
    (out,) = htf.ops.stitch_combine(
        rows, [0, 1], [2], ["mean"], field_segments=[3], segment_lengths=[0, 2, 0], weights=[0.0, 0.0]
    )
    np.testing.assert_array_equal(out.numpy(), np.zeros((3, 2)))


def test_result_is_independent_of_threads():
    """Deterministic summation order: bit-identical gradients on repeated runs."""
    rng = np.random.default_rng(1)
    rows = tf.constant(rng.standard_normal((1000, 16)).astype(np.float32))
    inverse = rng.integers(0, 1000, size=200_000)
    with tf.GradientTape() as tape:
        tape.watch(rows)
        (out,) = htf.ops.stitch_combine(rows, inverse, [200_000], ["sum"], field_segments=[50_000],
                                        segment_lengths=np.full(50_000, 4))  # fmt: skip
        loss = tf.reduce_sum(out * out)
    g1 = tape.gradient(loss, rows).numpy()
    with tf.GradientTape() as tape:
        tape.watch(rows)
        (out,) = htf.ops.stitch_combine(rows, inverse, [200_000], ["sum"], field_segments=[50_000],
                                        segment_lengths=np.full(50_000, 4))  # fmt: skip
        loss = tf.reduce_sum(out * out)
    np.testing.assert_array_equal(g1, tape.gradient(loss, rows).numpy())


# --- bad input -------------------------------------------------------------------------------


def test_inverse_out_of_range():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"inverse\[1\] = 5 is out of range \[0, 2\)"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 5], [2], ["none"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"inverse\[0\] = -1 is out of range"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [-1, 0], [2], ["none"])


def test_field_sizes_must_cover_every_position():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"field_sizes sum to 3 positions but inverse has 2"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [1, 2], ["none", "none"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"field_sizes\[0\] = -1 is negative"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [-1, 3], ["none", "none"])


def test_bag_lengths_must_match_field_sizes():
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"bag lengths of field 0 sum to 3 but field_sizes\[0\] = 2"
    ):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [2], ["sum"], field_segments=[2], segment_lengths=[1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"only 1 segment_lengths are left"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [2], ["sum"], field_segments=[2], segment_lengths=[2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"segment_lengths has 3 entries but the bag fields use 2"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [2], ["sum"], field_segments=[2], segment_lengths=[1, 1, 0])


def test_weights_length_and_rank_errors():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"weights must be empty or have one entry per id"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [2], ["sum"], weights=[1.0])
    with pytest.raises(ValueError, match=r"rows must be a matrix"):
        htf.ops.stitch_combine(tf.ones([2]), [0, 1], [2], ["none"])


def test_python_argument_errors():
    with pytest.raises(ValueError, match="combiners must be among"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [2], ["max"])
    with pytest.raises(ValueError, match="field_sizes has 2 entries but there are 1 combiners"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0, 1], [1, 1], ["none"])
    with pytest.raises(TypeError, match="rows must be float32 or float64"):
        htf.ops.stitch_combine(tf.ones([2, 3], tf.int32), [0, 1], [2], ["none"])
    with pytest.raises(TypeError, match="inverse must be int32 or int64"):
        htf.ops.stitch_combine(tf.ones([2, 3]), [0.0, 1.0], [2], ["none"])


def test_raw_op_attribute_errors():
    ops = load_ops()
    args = (tf.ones([2, 3]), tf.constant([0, 1]), tf.constant([2], tf.int64), tf.constant([2], tf.int64))
    rest = (tf.zeros([0], tf.int64), tf.zeros([0]))
    with pytest.raises(
        (tf.errors.InvalidArgumentError, ValueError), match=r"combiners has 2 entries but num_fields is 1"
    ):
        ops.hybrid_tf_stitch_combine(*args, *rest, num_fields=1, combiners=["none", "sum"])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"combiner must be one of"):
        ops.hybrid_tf_stitch_combine(*args, *rest, num_fields=1, combiners=["max"])


def test_grad_op_checks_gradient_shapes():
    ops = load_ops()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads\[0\] must have shape \[2, dim\]"):
        ops.hybrid_tf_stitch_combine_grad(
            [tf.ones([3, 4])],
            tf.constant([0, 1]),
            tf.constant([2], tf.int64),
            tf.constant([2], tf.int64),
            tf.zeros([0], tf.int64),
            tf.zeros([0]),
            tf.constant(2, tf.int64),
            combiners=["none"],
        )

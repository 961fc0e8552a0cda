"""HybridTF>RegularizationPenalty: vs NumPy and Keras's own regularizers, property-based, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run import regularized_apply as ra

F = np.float32
R = tf.keras.regularizers
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _reference(var, ranges, l1, l2):
    """Float64 sums, then Keras's float32 steps: ``0 + l1 * sum|w| + (2 * l2) * (sum(w^2) / 2)``."""
    out = []
    for (b, e), a, c in zip(ranges, l1, l2):
        w = var[b:e].astype(np.float64)
        value = F(0)
        if a:
            value = value + F(a) * F(np.abs(w).sum())
        if c:
            value = value + (F(2) * F(c)) * F(0.5 * (w * w).sum())
        out.append(value)
    return np.array(out, F)


def _penalty(var, ranges, l1, l2):
    v = tf.Variable(var)
    return ra.regularization_penalty(
        v, tf.constant(np.asarray(ranges, np.int64).reshape(-1, 2)), tf.constant(l1, F), tf.constant(l2, F)
    ).numpy()


@st.composite
def penalty_cases(draw):
    rows = draw(st.integers(0, 300))
    dim = draw(st.sampled_from([1, 3, 8, 16]))
    cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=8)))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    factor = st.sampled_from([0.0, 1e-5, 0.01, 0.5, 3.0])
    l1 = np.array([draw(factor) for _ in pairs], F)
    l2 = np.array([draw(factor) for _ in pairs], F)
    seed = draw(st.integers(0, 2**31 - 1))
    var = np.random.default_rng(seed).normal(size=(rows, dim)).astype(F)
    return var, np.array(pairs, np.int64).reshape(-1, 2), l1, l2


@SETTINGS
@given(penalty_cases())
def test_matches_numpy(case):
    var, ranges, l1, l2 = case
    got = _penalty(var, ranges, l1, l2)
    assert got.shape == (len(ranges),) and got.dtype == F
    np.testing.assert_allclose(got, _reference(var, ranges, l1, l2), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "regularizer",
    [R.l2(1e-5), R.l2(0.0), R.l1(0.01), R.l1_l2(0.01, 0.02), R.L1L2(0.0, 0.3), R.L1L2(0.2, 0.0)],
    ids=["l2", "l2_zero", "l1", "l1_l2", "l1l2_only_l2", "l1l2_only_l1"],
)
def test_matches_keras_regularizers_on_large_tables(regularizer):
    # 3 members of 40k-130k rows x 8: several of the kernel's blocks per member, and blocks straddling none.
    rng = np.random.default_rng(7)
    var = rng.normal(scale=0.05, size=(300_001, 8)).astype(F)
    ranges = np.array([[0, 40_000], [40_000, 170_000], [200_000, 300_001]], np.int64)
    l1 = float(getattr(regularizer, "l1", 0.0))
    l2 = float(getattr(regularizer, "l2", 0.0))
    got = _penalty(var, ranges, np.full(3, l1, F), np.full(3, l2, F))
    want = [float(regularizer(tf.constant(var[b:e]))) for b, e in ranges]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_empty_ranges_and_no_ranges():
    var = np.ones((10, 4), F)
    np.testing.assert_array_equal(_penalty(var, [[3, 3], [3, 10]], [1.0, 0.0], [1.0, 0.5]), [0.0, 14.0])
    assert _penalty(var, np.zeros((0, 2), np.int64), np.zeros(0, F), np.zeros(0, F)).shape == (0,)
    assert _penalty(np.zeros((0, 4), F), [[0, 0]], [1.0], [1.0]).tolist() == [0.0]


def test_no_gradient_flows_and_reads_the_current_value():
    v = tf.Variable(np.full((6, 2), 2.0, F))
    args = (tf.constant([[0, 6]], tf.int64), tf.constant([0.0], F), tf.constant([0.5], F))
    with tf.GradientTape() as tape:
        p = ra.regularization_penalty(v, *args)
        loss = tf.reduce_sum(p) + tf.reduce_sum(v.read_value()) * 0.0
    grad = tape.gradient(loss, v)
    np.testing.assert_array_equal(grad, np.zeros((6, 2), F))  # only the read's zero gradient
    assert float(p[0]) == 24.0

    @tf.function
    def assign_then_penalty():
        v.assign(tf.ones((6, 2)))
        return ra.regularization_penalty(v, *args)  # ordered after the assignment (automatic control deps)

    assert float(assign_then_penalty()[0]) == 6.0


@pytest.mark.parametrize(
    "ranges, l1, l2, message",
    [
        ([[5, 10], [8, 12]], [0.0, 0.0], [0.1, 0.1], "ascending, non-overlapping"),
        ([[50, 61]], [0.0], [0.1], r"inside \[0, 60\)"),
        ([[4, 2]], [0.0], [0.1], "ascending, non-overlapping"),
        ([[-1, 2]], [0.0], [0.1], "ascending, non-overlapping"),
        ([[0, 5]], [-1.0], [0.1], "finite and >= 0"),
        ([[0, 5]], [0.0], [np.nan], "finite and >= 0"),
        ([[0, 5]], [np.inf], [0.0], "finite and >= 0"),
    ],
)
def test_bad_ranges_are_invalid_argument(ranges, l1, l2, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _penalty(np.ones((60, 4), F), ranges, np.array(l1, F), np.array(l2, F))


def test_bad_shapes_and_tables_are_invalid_argument():
    v = tf.Variable(np.ones((10, 4), F))
    ranges, l1 = tf.constant([[0, 5]], tf.int64), tf.constant([0.1], F)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"reg_ranges must be|rank|Dimension"):
        ra.regularization_penalty(v, tf.constant([0, 5], tf.int64), l1, l1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"reg_ranges must be|Dimension"):
        ra.regularization_penalty(v, ranges, tf.constant([0.1, 0.2], F), l1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32 table variable"):
        ra.regularization_penalty(tf.Variable(np.ones((10, 4))), ranges, l1, l1)  # float64
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32 table variable"):
        ra.regularization_penalty(tf.Variable(np.ones(10, F)), ranges, l1, l1)  # a vector


def test_raw_op_bad_shapes_in_a_graph_are_invalid_argument():
    """Shapes unknown when the graph is built: the kernel itself refuses them."""
    v = tf.Variable(np.ones((10, 4), F))

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, F)])
    def run(ranges, l1):
        return ra.regularization_penalty(v, ranges, l1, l1)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reg_ranges must be \[num_ranges, 2\]"):
        run(tf.constant([[0, 5, 7]], tf.int64), tf.constant([0.1], F))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reg_ranges must be"):
        run(tf.constant([[0, 5]], tf.int64), tf.constant([[0.1]], F))
    np.testing.assert_allclose(run(tf.constant([[0, 5]], tf.int64), tf.constant([0.1], F)), [0.1 * 20 + 0.1 * 20])

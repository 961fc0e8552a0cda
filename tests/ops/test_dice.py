"""HybridTF>Dice (+ DiceGrad) vs a float64 NumPy / unfused-TF reference; determinism; bad input.

Property-based shapes (one row, several reduction blocks, units not a multiple of 8, rank 2 and 3, large values),
float32 and float64. The forward is compared with NumPy in float64; the gradients (of y, and of the mean and variance
outputs) with ``tf.GradientTape`` over the unfused TensorFlow math (``tf.nn.moments``, ``tf.nn.batch_normalization``,
sigmoid gate) in float64, and with ``tf.test.compute_gradient``. Results do not depend on the thread count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.dice import dice
from hybridtf._src.run.loader import load_ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _numpy_dice(x, alpha, epsilon):
    x = x.astype(np.float64).reshape(-1, x.shape[-1])
    mean = x.mean(0)
    variance = ((x - mean) ** 2).mean(0)
    z = (x - mean) / np.sqrt(variance + epsilon)
    p = 1.0 / (1.0 + np.exp(-z))
    return alpha * (1.0 - p) * x + p * x, mean, variance


def _unfused(x, alpha, epsilon):
    """The unfused TensorFlow math (DeepCTR's Dice on a train-mode BatchNormalization)."""
    mean, variance = tf.nn.moments(x, axes=list(range(x.shape.rank - 1)))
    p = tf.sigmoid(tf.nn.batch_normalization(x, mean, variance, None, None, epsilon))
    return alpha * (1.0 - p) * x + p * x, mean, variance


def _gradients(fn, x, alpha, epsilon, seed=1):
    """d/dx and d/dalpha of sum(y * g) + mean . gm + variance . gv (fixed g, gm, gv)."""
    rng = np.random.default_rng(seed)
    g = tf.constant(rng.standard_normal(x.shape), x.dtype)
    gm = tf.constant(rng.standard_normal(x.shape[-1:]), x.dtype)
    gv = tf.constant(rng.standard_normal(x.shape[-1:]), x.dtype)
    with tf.GradientTape() as tape:
        tape.watch([x, alpha])
        y, mean, variance = fn(x, alpha, epsilon)
        loss = tf.reduce_sum(y * g) + tf.reduce_sum(mean * gm) + tf.reduce_sum(variance * gv)
    return [t.numpy() for t in tape.gradient(loss, [x, alpha])]


def _close(got, want, rtol, scale=None):
    """Within ``rtol`` of ``scale`` (default: the reference's; elementwise relative error is meaningless near 0)."""
    scale = max(float(np.abs(want).max()) if scale is None else scale, 1e-30)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=rtol * scale)


@st.composite
def dice_cases(draw):
    rows = draw(st.sampled_from([1, 2, 3, 17, 255, 256, 257, 700]))
    units = draw(st.sampled_from([1, 3, 7, 8, 13, 40, 80]))
    shape = (rows // 5, 5, units) if draw(st.booleans()) and rows % 5 == 0 else (rows, units)
    # large and small values; the spread stays within 10x of the offset (a float32 batch norm of values whose
    # spread is far below their float32 resolution is ill-conditioned in any implementation)
    scale, shift = draw(st.sampled_from([(1.0, 0.0), (1.0, 1.0), (1e-3, 1e-3), (1e3, 1e3), (1e3, 0.0), (1e-3, 0.0)]))
    epsilon = draw(st.sampled_from([1e-9, 1e-3, 0.5]))
    if rows == 1:
        # one row: x - mean is 0, and the gradient is a difference of two terms of size |dy * x| / sqrt(epsilon)
        # that cancel exactly; in float32 their rounding is the result. Keep them small.
        scale, shift, epsilon = 1.0, 0.0, 0.5
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = (rng.standard_normal(shape) * scale + shift).astype(dtype)
    alpha = rng.standard_normal(units).astype(dtype)
    return x, alpha, epsilon


@SETTINGS
@given(dice_cases())
def test_forward_matches_float64_numpy(case):
    x, alpha, epsilon = case
    y, mean, variance = dice(tf.constant(x), tf.constant(alpha), epsilon)
    assert y.shape == x.shape and mean.shape == variance.shape == (x.shape[-1],)
    want_y, want_mean, want_variance = _numpy_dice(x, alpha.astype(np.float64), np.float32(epsilon))
    rtol = 2e-6 if x.dtype == np.float32 else 1e-12
    # y = alpha * (1 - p) * x + p * x: its two terms are each up to |alpha * x| and |x|, and may cancel
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    terms = float(np.max(np.abs(flat) * (np.abs(alpha) + 1)))
    # x - mean loses digits when a column's spread is far below its mean (a batch of 2 or 3 rows draws such
    # columns by chance: -1.0662 and -1.0628): its normalized values then carry the float32 rounding of the mean
    # times |mean| / std, in any implementation. The tolerance grows with that condition number past 10.
    std = np.sqrt(flat.var(0) + epsilon)
    condition = np.maximum(1.0, (np.abs(flat.mean(0)) + std) / std / 10)
    got_y = y.numpy().reshape(want_y.shape).astype(np.float64)
    bound = rtol * terms * condition.reshape([1] * (x.ndim - 1) + [-1]) + rtol * np.abs(want_y)
    worst = float(np.max(np.abs(got_y - want_y) - bound))
    assert worst <= 0, f"y differs from the float64 reference beyond the conditioned tolerance by {worst}"
    _close(mean.numpy(), want_mean, rtol)
    _close(variance.numpy(), want_variance, 4 * rtol)


@SETTINGS
@given(dice_cases())
def test_gradients_match_the_unfused_math_in_float64(case):
    """Within 3e-5 (float32) of the float64 gradient's scale, or no further from it than the unfused graph is.

    Where a unit's variance is tiny next to its values' spread per row (two rows close together), the gradient
    is a difference of terms of size ``|dy * x| / sqrt(variance)`` that nearly cancel: any float32 evaluation,
    TensorFlow's unfused ops included, is off by their rounding there.
    """
    x, alpha, epsilon = case
    eps = float(np.float32(epsilon))  # the op's attr is a float32
    got = _gradients(dice, tf.constant(x), tf.constant(alpha), epsilon)
    plain = _gradients(_unfused, tf.constant(x), tf.constant(alpha), eps)  # the same dtype as the op's
    want = _gradients(_unfused, tf.constant(x.astype(np.float64)), tf.constant(alpha.astype(np.float64)), eps)
    rtol = 3e-5 if x.dtype == np.float32 else 1e-9
    for g, p, w in zip(got, plain, want):
        assert g.shape == w.shape
        err, plain_err = float(np.max(np.abs(g - w))), float(np.max(np.abs(p - w)))
        assert err <= max(rtol * float(np.abs(w).max()), 2 * plain_err), (err, plain_err)


def test_compute_gradient_through_y_mean_and_variance():
    rng = np.random.default_rng(4)
    x = tf.constant(rng.standard_normal((6, 3, 5)) * 2 + 1, tf.float64)
    alpha = tf.constant(rng.standard_normal(5), tf.float64)

    def outputs(x, alpha):
        y, mean, variance = dice(x, alpha, 1e-3)
        return tf.concat([tf.reshape(y, [-1]), mean * 0.7, variance * 1.3], 0)

    theoretical, numerical = tf.test.compute_gradient(outputs, [x, alpha])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


_THREADS_SCRIPT = """
import json, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hybridtf._src.run.dice import dice
rng = np.random.default_rng(7)
x = tf.constant(rng.standard_normal((4000, 37)).astype(np.float32) * 3 + 1)
alpha = tf.constant(rng.standard_normal(37).astype(np.float32))
g = tf.constant(rng.standard_normal((4000, 37)).astype(np.float32))
with tf.GradientTape() as tape:
    tape.watch([x, alpha])
    y, mean, variance = dice(x, alpha, 1e-9)
    loss = tf.reduce_sum(y * g)
out = [y, mean, variance, *tape.gradient(loss, [x, alpha])]
print("RESULT" + json.dumps([t.numpy().tobytes().hex() for t in out]))
"""


def test_results_do_not_depend_on_the_thread_count():
    results = []
    for threads in (1, 4):
        proc = subprocess.run(
            [sys.executable, "-c", _THREADS_SCRIPT, str(threads)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"},
            check=True,
            timeout=300,
        )
        line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
        results.append(json.loads(line[len("RESULT") :]))
    assert results[0] == results[1]


@pytest.mark.parametrize(
    ("x_shape", "alpha_len", "epsilon", "message"),
    [
        ((5, 4), 3, 1e-9, "alpha has 3 values but x has 4 units"),
        ((6,), 6, 1e-9, "rank >= 2"),
        ((0, 4), 4, 1e-9, "at least one row"),
        ((2, 0), 0, 1e-9, "at least one row and one unit"),
        ((5, 4), 4, -1.0, "epsilon must be finite and >= 0"),
        ((5, 4), 4, float("inf"), "epsilon must be finite and >= 0"),
    ],
)
def test_bad_input_is_an_invalid_argument(x_shape, alpha_len, epsilon, message):
    x = tf.ones(x_shape)
    alpha = tf.ones([alpha_len])
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        dice(x, alpha, epsilon)


def test_bad_gradient_input_is_an_invalid_argument():
    ops = load_ops()
    x, alpha, stat = tf.ones([5, 4]), tf.ones([4]), tf.ones([4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="dy must have x's shape"):
        ops.hybrid_tf_dice_grad(tf.ones([5, 3]), stat, stat, x, alpha, stat, stat, epsilon=1e-9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="variance must have shape \\[4\\]"):
        ops.hybrid_tf_dice_grad(tf.ones([5, 4]), stat, stat, x, alpha, stat, tf.ones([3]), epsilon=1e-9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="alpha has 2 values"):
        ops.hybrid_tf_dice_grad(tf.ones([5, 4]), stat, stat, x, tf.ones([2]), stat, stat, epsilon=1e-9)


def test_shape_function_rejects_a_static_mismatch():
    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([3])])
    def bad(x, alpha):
        return dice(x, alpha, 1e-9)[0]

    with pytest.raises(ValueError, match="Dimensions must be equal"):
        bad.get_concrete_function()

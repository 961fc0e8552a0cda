"""HybridTF>RegularizedApply{Sgd,Adagrad,Adam}: vs a NumPy reference of Keras's math, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hybridtf._src.run import regularized_apply as ra

F = np.float32
ROWS = 60
H = dict(lr=F(0.1), eps=F(1e-7), alpha=F(0.01), c1=F(0.1), c2=F(0.001))


def _reference(kind, var, s1, s2, idx, grad, ranges, l1, l2):
    """Keras 2.15: regularized rows get the dense update of batch + l1 * sign(w) + w * 2 * l2, others the sparse one."""
    var, s1, s2 = var.copy(), s1.copy(), s2.copy()
    where = {int(r): u for u, r in enumerate(idx)}
    factors = {}
    for (b, e), a, c in zip(ranges, l1, l2):
        for r in range(b, e):
            factors[r] = (F(a), F(c))
    for r in range(var.shape[0]):
        w = var[r]
        gb = grad[where[r]] if r in where else None
        if r in factors:
            a, c = factors[r]
            g = (gb if gb is not None else np.zeros_like(w)) + (a * np.sign(w) + w * (F(2) * c))
            if kind == "sgd":
                var[r] = w + (-g) * H["lr"]
            elif kind == "adagrad":
                s1[r] = s1[r] + g * g
                var[r] = w - (H["lr"] * g) / np.sqrt(s1[r] + H["eps"])
            else:
                s1[r] = s1[r] + (g - s1[r]) * H["c1"]
                s2[r] = s2[r] + (g * g - s2[r]) * H["c2"]
                var[r] = w - (s1[r] * H["alpha"]) / (np.sqrt(s2[r]) + H["eps"])
            continue
        if kind == "adam":  # every row decays and moves
            s1[r] = s1[r] + (-s1[r]) * H["c1"]
            s2[r] = s2[r] + (-s2[r]) * H["c2"]
            if gb is not None:
                s1[r] = s1[r] + gb * H["c1"]
                s2[r] = s2[r] + (gb * gb) * H["c2"]
            var[r] = w - (s1[r] * H["alpha"]) / (np.sqrt(s2[r]) + H["eps"])
        elif gb is None:
            continue
        elif kind == "sgd":
            var[r] = w + (-gb) * H["lr"]
        elif kind == "adagrad":
            s1[r] = s1[r] + gb * gb
            var[r] = w + ((-H["lr"]) * gb) / np.sqrt(s1[r] + H["eps"])
        else:  # lazy_adam
            s1[r] = (s1[r] + (-s1[r]) * H["c1"]) + gb * H["c1"]
            s2[r] = (s2[r] + (-s2[r]) * H["c2"]) + (gb * gb) * H["c2"]
            var[r] = w - (s1[r] * H["alpha"]) / (np.sqrt(s2[r]) + H["eps"])
    return var, s1, s2


def _run(kind, var, s1, s2, idx, grad, ranges, l1, l2):
    v, a, b = (tf.Variable(x) for x in (var, s1, s2))
    args = (tf.constant(grad), tf.constant(idx), tf.constant(ranges, tf.int64), tf.constant(l1), tf.constant(l2))
    if kind == "sgd":
        ra.regularized_apply_sgd(v, tf.constant(H["lr"]), *args)
    elif kind == "adagrad":
        ra.regularized_apply_adagrad(v, a, tf.constant(H["lr"]), tf.constant(H["eps"]), *args)
    else:
        scalars = [tf.constant(H[k]) for k in ("alpha", "c1", "c2", "eps")]
        ra.regularized_apply_adam(v, a, b, *scalars, *args, lazy=kind == "lazy_adam")
    return v.numpy(), a.numpy(), b.numpy()


def _inputs(dim, idx_dtype, order, seed):
    rng = np.random.default_rng(seed)
    var = rng.normal(size=(ROWS, dim)).astype(F)
    var[3] = 0.0  # sign(0) = 0
    s1 = rng.random((ROWS, dim)).astype(F)
    s2 = rng.random((ROWS, dim)).astype(F)
    idx = np.sort(rng.choice(ROWS, size=25, replace=False)).astype(idx_dtype)
    if order == "unsorted":
        idx = rng.permutation(idx)
    grad = rng.normal(size=(len(idx), dim)).astype(F)
    ranges = np.array([[0, 10], [10, 10], [22, 31], [50, 60]], np.int64)  # adjacent, empty, middle, last
    l1 = np.array([0.01, 0.5, 0.0, 0.02], F)
    l2 = np.array([0.0, 0.5, 0.03, 0.01], F)
    return var, s1, s2, idx, grad, ranges, l1, l2


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "lazy_adam"])
@pytest.mark.parametrize("dim", [1, 4, 5, 16])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_matches_keras_math(kind, dim, idx_dtype, order):
    inputs = _inputs(dim, idx_dtype, order, seed=dim)
    for got, want in zip(_run(kind, *inputs), _reference(kind, *inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_no_ranges_equals_the_sparse_update_and_empty_gradient_moves_only_regularized_rows():
    var, s1, s2, idx, grad, ranges, l1, l2 = _inputs(4, np.int64, "sorted", seed=1)
    none = (np.zeros((0, 2), np.int64), np.zeros(0, F), np.zeros(0, F))
    for got, want in zip(
        _run("adagrad", var, s1, s2, idx, grad, *none), _reference("adagrad", var, s1, s2, idx, grad, *none)
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    empty = (np.zeros(0, np.int64), np.zeros((0, 4), F))
    got = _run("sgd", var, s1, s2, *empty, ranges, l1, l2)[0]
    np.testing.assert_array_equal(got[10:22], var[10:22])  # unregularized rows: untouched
    np.testing.assert_allclose(got, _reference("sgd", var, s1, s2, *empty, ranges, l1, l2)[0], rtol=1e-6)


@pytest.mark.parametrize(
    "ranges, l1, l2, message",
    [
        ([[5, 10], [8, 12]], [0.0, 0.0], [0.1, 0.1], "ascending, non-overlapping"),
        ([[50, 61]], [0.0], [0.1], r"inside \[0, 60\)"),
        ([[4, 2]], [0.0], [0.1], "ascending, non-overlapping"),
        ([[0, 5]], [-1.0], [0.1], "finite and >= 0"),
        ([[0, 5]], [0.0], [np.nan], "finite and >= 0"),
    ],
)
def test_bad_ranges_are_invalid_argument(ranges, l1, l2, message):
    var, s1, s2, idx, grad, *_ = _inputs(4, np.int64, "sorted", seed=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _run("adagrad", var, s1, s2, idx, grad, np.array(ranges, np.int64), np.array(l1, F), np.array(l2, F))


def test_bad_shapes_and_indices_are_invalid_argument():
    var, s1, s2, idx, grad, ranges, l1, l2 = _inputs(4, np.int64, "sorted", seed=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reg_ranges must be \[num_ranges, 2\]"):
        _run("sgd", var, s1, s2, idx, grad, ranges[:, :1], l1, l2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"reg_ranges must be"):
        _run("sgd", var, s1, s2, idx, grad, ranges, l1[:2], l2)
    bad = idx.copy()
    bad[-1] = ROWS
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        _run("adam", var, s1, s2, bad, grad, ranges, l1, l2)
    bad[-1] = bad[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="repeated"):
        _run("adam", var, s1, s2, bad, grad, ranges, l1, l2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match gradient rows"):
        _run("sgd", var, s1, s2, idx, grad[:, :3], ranges, l1, l2)


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_aliased_variables_are_invalid_argument_not_a_deadlock(kind):
    var, _, _, idx, grad, ranges, l1, l2 = _inputs(4, np.int64, "sorted", seed=4)
    v = tf.Variable(var)
    args = (tf.constant(grad), tf.constant(idx), tf.constant(ranges, tf.int64), tf.constant(l1), tf.constant(l2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same variable"):
        if kind == "adagrad":  # the table is its own accumulator
            ra.regularized_apply_adagrad(v, v, tf.constant(H["lr"]), tf.constant(H["eps"]), *args)
        else:  # m is v
            m = tf.Variable(np.zeros_like(var))
            scalars = [tf.constant(H[k]) for k in ("alpha", "c1", "c2", "eps")]
            ra.regularized_apply_adam(v, m, m, *scalars, *args)

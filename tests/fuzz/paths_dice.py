"""How a Dice / DiceGrad fuzz case runs (raw op or the Python wrapper with its gradient) and its NumPy reference."""

from __future__ import annotations

import numpy as np

from tests.fuzz.paths import NotApplicable, _np, _ops, _tf


def run_dice(c, path):
    tf = _tf()
    x, alpha = tf.constant(c["x"]), tf.constant(c["alpha"])
    if path == "raw":
        return [_np(t) for t in _ops().hybrid_tf_dice(x, alpha, epsilon=c["epsilon"])]
    from hybridtf._src.run.dice import dice

    return [_np(t) for t in dice(x, alpha, c["epsilon"])]


def _forward(c):
    x = np.asarray(c["x"], np.float64)
    flat = x.reshape(-1, x.shape[-1])
    mean = flat.mean(0)
    variance = ((flat - mean) ** 2).mean(0)
    return x, flat, mean, variance


def ref_dice(c):
    x, flat, mean, variance = _forward(c)
    alpha = np.asarray(c["alpha"], np.float64)
    p = 1.0 / (1.0 + np.exp(-(flat - mean) / np.sqrt(variance + np.float32(c["epsilon"]))))
    y = alpha * (1.0 - p) * flat + p * flat
    return [y.reshape(x.shape).astype(c["x"].dtype), mean, variance]


def run_dice_grad(c, path):
    tf = _tf()
    if path == "raw":
        args = [tf.constant(c[k]) for k in ("dy", "dmean", "dvariance", "x", "alpha", "mean", "variance")]
        return [_np(t) for t in _ops().hybrid_tf_dice_grad(*args, epsilon=c["epsilon"])]
    from hybridtf._src.run.dice import dice

    x, alpha = tf.constant(c["x"]), tf.constant(c["alpha"])
    if c["dy"].shape != c["x"].shape or c["variance"].shape != c["mean"].shape:
        raise NotApplicable("the gradient through the wrapper takes dy of y's shape and no statistics")
    with tf.GradientTape() as tape:
        tape.watch([x, alpha])
        y, mean, variance = dice(x, alpha, c["epsilon"])
        loss = tf.reduce_sum(y * c["dy"]) + tf.reduce_sum(mean * c["dmean"]) + tf.reduce_sum(variance * c["dvariance"])
    return [_np(t) for t in tape.gradient(loss, [x, alpha])]


def ref_dice_grad(c):
    """The train-mode gradient in float64, from the case's mean and variance (as the op takes them)."""
    x = np.asarray(c["x"], np.float64)
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    alpha = np.asarray(c["alpha"], np.float64)
    mean, variance = (np.asarray(c[k], np.float64) for k in ("mean", "variance"))
    dy = np.asarray(c["dy"], np.float64).reshape(flat.shape)
    ve = variance + np.float32(c["epsilon"])
    inv = 1.0 / np.sqrt(ve)
    p = 1.0 / (1.0 + np.exp(-(flat - mean) * inv))
    dz = dy * flat * (1.0 - alpha) * p * (1.0 - p)
    d_mean = -inv * dz.sum(0) + np.asarray(c["dmean"], np.float64)
    d_var = -0.5 / (ve * np.sqrt(ve)) * (dz * (flat - mean)).sum(0) + np.asarray(c["dvariance"], np.float64)
    dx = dy * (alpha * (1.0 - p) + p) + dz * inv + 2.0 * d_var * (flat - mean) / n + d_mean / n
    dalpha = (dy * flat * (1.0 - p)).sum(0)
    return [dx.reshape(x.shape), dalpha]

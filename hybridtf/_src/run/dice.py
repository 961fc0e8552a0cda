"""Python wrapper and gradient of the fused ``HybridTF>Dice`` op (DIN's Dice activation, train-mode batch norm)."""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.second_order import FUSION_FIX, refuse_second_order

OP_NAME = "HybridTF>Dice"
GRAD_OP_NAME = "HybridTF>DiceGrad"

refuse_second_order(GRAD_OP_NAME, FUSION_FIX)  # no second-order gradient: refused by name


def dice(x: tf.Tensor, alpha: tf.Tensor, epsilon: float) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Dice over ``x``'s last axis with batch statistics: ``(y, mean, variance)``.

    Per unit, over every row of ``x`` (all axes but the last): the batch mean and
    (biased) variance, ``z = x * inv + (-mean * inv)`` with
    ``inv = rsqrt(variance + epsilon)``, ``p = sigmoid(z)`` and
    ``y = alpha * (1 - p) * x + p * x``: what DeepCTR's ``Dice`` (a Keras
    ``BatchNormalization(center=False, scale=False)`` in training mode, then the
    gate) computes, in one pass for the statistics and one for ``y``. The
    gradient (``DiceGrad``) runs through the batch statistics.

    Args:
        x: ``[..., units]`` float32 / float64, rank >= 2, at least one row.
        alpha: ``[units]``, the same dtype.
        epsilon: added to the variance (finite, >= 0).

    Returns:
        ``y`` (``x``'s shape), ``mean`` and ``variance`` (``[units]`` each).

    Raises:
        tf.errors.InvalidArgumentError: bad shapes (``alpha``'s length is not ``x``'s last dim,
            rank < 2, no rows) or epsilon.

    Example:
        >>> y, mean, variance = dice(x, alphas, 1e-9)  # x: [B, T, 80], alphas: [80]
    """
    return tuple(load_ops().hybrid_tf_dice(x, alpha, epsilon=float(epsilon)))


@tf.RegisterGradient(OP_NAME)
def _dice_grad(op, dy, dmean, dvariance):
    x, alpha = op.inputs
    _, mean, variance = op.outputs
    zeros = tf.zeros_like(mean)
    dx, dalpha = load_ops().hybrid_tf_dice_grad(
        dy,
        zeros if dmean is None else dmean,
        zeros if dvariance is None else dvariance,
        x,
        alpha,
        mean,
        variance,
        epsilon=op.get_attr("epsilon"),
    )
    return dx, dalpha

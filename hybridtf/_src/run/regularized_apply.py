"""Python wrappers of the regularized fused updates (``HybridTF>RegularizedApply*``).

Like ``sparse_apply`` (one packed table, its optimizer slots, a gradient with
distinct rows), plus the packed table's regularized row ranges: ``reg_ranges``
``[R, 2]`` int64 ``[begin, end)`` and their factors ``reg_l1`` / ``reg_l2``
``[R]``. Those rows take Keras's dense update with the regularizer's gradient
added; the other rows the sparse update. See kernels/regularized_apply.

``regularization_penalty`` computes the penalties' values themselves (what
Keras's ``L1`` / ``L2`` / ``L1L2`` return for each member table) for all
regularized ranges of a packed table in one read pass, with no gradient: the
fused updates above add the penalties' gradient.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps_utils

from hybridtf._src.run.loader import load_ops

PENALTY_OP = "HybridTF>RegularizationPenalty"

# Only reads the variable: automatic control dependencies may run it beside other reads.
auto_control_deps_utils.register_read_only_resource_op(PENALTY_OP)
# Its gradient is the fused updates' business (folded in), never TensorFlow's.
tf.no_gradient(PENALTY_OP)


def regularization_penalty(var, reg_ranges, reg_l1, reg_l2):
    """``[R]`` float32: ``l1 * sum|w| + 2 * l2 * l2_loss(w)`` over each range's rows of ``var``.

    Args:
        var: a float32 ``[rows, dim]`` resource variable (a packed table).
        reg_ranges: int64 ``[R, 2]`` row ranges ``[begin, end)``, ascending, not overlapping.
        reg_l1: float32 ``[R]`` L1 factors (>= 0).
        reg_l2: float32 ``[R]`` L2 factors (>= 0).

    Returns:
        The penalties, one per range: Keras's ``L1`` / ``L2`` / ``L1L2`` value of
        that member table (fp32, within a few roundings of Keras's sum). No
        gradient flows through it.

    Raises:
        tf.errors.InvalidArgumentError: ranges outside the table, not ascending,
            negative or non-finite factors, mismatched lengths, a non-float32 table.

    Example:
        >>> regularization_penalty(packed, [[0, 100], [250, 300]], [0.0, 0.0], [1e-5, 1e-5])
    """
    return load_ops().hybrid_tf_regularization_penalty(var.handle, reg_ranges, reg_l1, reg_l2)


def regularized_apply_sgd(var, lr, grad, indices, reg_ranges, reg_l1, reg_l2):
    """Keras SGD (no momentum) with the regularized ranges' dense gradient folded in."""
    return load_ops().hybrid_tf_regularized_apply_sgd(var.handle, lr, grad, indices, reg_ranges, reg_l1, reg_l2)


def regularized_apply_adagrad(var, accum, lr, epsilon, grad, indices, reg_ranges, reg_l1, reg_l2):
    """Keras Adagrad with the regularized ranges' dense gradient folded in."""
    return load_ops().hybrid_tf_regularized_apply_adagrad(
        var.handle, accum.handle, lr, epsilon, grad, indices, reg_ranges, reg_l1, reg_l2
    )


def regularized_apply_adam(
    var, m, v, alpha, one_minus_beta1, one_minus_beta2, epsilon, grad, indices, reg_ranges, reg_l1, reg_l2, lazy=False
):
    """Keras Adam (or LazyAdam: ``lazy``) with the regularized ranges' dense gradient folded in."""
    return load_ops().hybrid_tf_regularized_apply_adam(
        var.handle,
        m.handle,
        v.handle,
        alpha,
        one_minus_beta1,
        one_minus_beta2,
        epsilon,
        grad,
        indices,
        reg_ranges,
        reg_l1,
        reg_l2,
        lazy=lazy,
    )

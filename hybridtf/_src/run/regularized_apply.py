"""Python wrappers of the regularized fused updates (``HybridTF>RegularizedApply*``).

Like ``sparse_apply`` (one packed table, its optimizer slots, a gradient with
distinct rows), plus the packed table's regularized row ranges: ``reg_ranges``
``[R, 2]`` int64 ``[begin, end)`` and their factors ``reg_l1`` / ``reg_l2``
``[R]``. Those rows take Keras's dense update with the regularizer's gradient
added; the other rows the sparse update. See kernels/regularized_apply.
"""

from __future__ import annotations

from hybridtf._src.run.loader import load_ops


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

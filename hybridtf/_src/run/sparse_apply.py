"""Python wrappers of the fused sparse optimizer updates (``HybridTF>SparseApply*``).

Each updates one variable (and its optimizer slots) in place for a gradient
with distinct row indices, reproducing the Keras 2.15 optimizer's float
operations for an IndexedSlices gradient. See kernels/sparse_apply.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops


def _check_distinct(**variables) -> None:
    """Raises ValueError when one variable is passed for two roles (the kernel rejects it too)."""
    seen = {}
    for role, var in variables.items():
        key = id(var.handle) if hasattr(var, "handle") else id(var)
        if key in seen:
            raise ValueError(
                f"the fused sparse update got the same variable as {seen[key]} and {role}; "
                "the table and each optimizer slot must be distinct variables."
            )
        seen[key] = role


def sparse_apply_sgd(var, lr, grad, indices):
    """``var[indices] += -grad * lr`` (Keras SGD without momentum).

    Example:
        >>> var = tf.Variable(tf.ones([4, 2]))
        >>> sparse_apply_sgd(var, tf.constant(0.5), tf.ones([1, 2]), tf.constant([2], tf.int64))  # doctest: +SKIP
        >>> var.numpy()[2]  # doctest: +SKIP
        array([0.5, 0.5], dtype=float32)
    """
    return load_ops().hybrid_tf_sparse_apply_sgd(var.handle, lr, grad, indices)


def sparse_apply_adagrad(var, accum, lr, epsilon, grad, indices):
    """Keras Adagrad on the rows ``indices`` of ``var`` and ``accum`` (distinct variables; repeated indices
    are applied one after the other, as Keras's sparse update does).

    Example:
        >>> var, accum = tf.Variable(tf.ones([4, 2])), tf.Variable(tf.fill([4, 2], 0.1))
        >>> sparse_apply_adagrad(  # doctest: +SKIP
        ...     var, accum, tf.constant(0.1), tf.constant(1e-7), tf.ones([1, 2]), tf.constant([3], tf.int64))
    """
    _check_distinct(var=var, accum=accum)
    return load_ops().hybrid_tf_sparse_apply_adagrad(var.handle, accum.handle, lr, epsilon, grad, indices)


def sparse_apply_adam(var, m, v, alpha, one_minus_beta1, one_minus_beta2, epsilon, grad, indices, lazy=False):
    """Keras Adam (``lazy=False``: every row's moments decay) or LazyAdam (touched rows only).

    ``alpha`` is the step's ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` (``adam_alpha``).

    Example:
        >>> var, m, v = (tf.Variable(tf.zeros([4, 2])) for _ in range(3))
        >>> sparse_apply_adam(  # doctest: +SKIP
        ...     var, m, v, tf.constant(0.001), tf.constant(0.1), tf.constant(0.001), tf.constant(1e-7),
        ...     tf.ones([1, 2]), tf.constant([1], tf.int64))
    """
    _check_distinct(var=var, m=m, v=v)
    return load_ops().hybrid_tf_sparse_apply_adam(
        var.handle, m.handle, v.handle, alpha, one_minus_beta1, one_minus_beta2, epsilon, grad, indices, lazy=lazy
    )


def adam_alpha(optimizer, dtype=tf.float32):
    """``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` exactly as Keras Adam computes it."""
    lr = tf.cast(optimizer.learning_rate, dtype)
    local_step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1_power = tf.pow(tf.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = tf.pow(tf.cast(optimizer.beta_2, dtype), local_step)
    return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)

"""Python wrappers of the fused sparse optimizer updates (``HybridTF>SparseApply*``).

Each updates one variable (and its optimizer slots) in place for a gradient
with distinct row indices, reproducing the Keras 2.15 optimizer's float
operations for an IndexedSlices gradient. See kernels/sparse_apply.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops


def sparse_apply_sgd(var, lr, grad, indices):
    """``var[indices] += -grad * lr`` (Keras SGD without momentum)."""
    return load_ops().hybrid_tf_sparse_apply_sgd(var.handle, lr, grad, indices)


def sparse_apply_adagrad(var, accum, lr, epsilon, grad, indices):
    """Keras Adagrad on the rows ``indices`` of ``var`` and ``accum``."""
    return load_ops().hybrid_tf_sparse_apply_adagrad(var.handle, accum.handle, lr, epsilon, grad, indices)


def sparse_apply_adam(var, m, v, alpha, one_minus_beta1, one_minus_beta2, epsilon, grad, indices, lazy=False):
    """Keras Adam (``lazy=False``: every row's moments decay) or LazyAdam (touched rows only)."""
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

"""Embeddings regularizers of packed tables: the same penalty, the same gradient.

A Keras layer built with ``embeddings_regularizer=r`` adds the callable loss
``r(embeddings)`` to ``model.losses``; its gradient is dense over the table
(Keras then updates every row). For a packed member table:

* **Value.** The layer's callable loss is replaced by one that evaluates the
  same regularizer object on the member's rows of the packed variable (same
  values, same shape, so the same float result), so ``model.losses`` and the
  compiled loss are unchanged.
* **Gradient.** Once an optimizer of the model is hooked by hybridtf
  (``compile``), the penalty is computed on ``stop_gradient`` of the rows and
  the optimizer adds the regularizer's gradient itself: in the fused update
  of the packed table (``HybridTF>RegularizedApply*``, one pass over the
  table, each regularized row with Keras's dense formula), or, where Keras's
  own update runs (an optimizer configuration hybridtf does not fuse, a
  replicated table under Horovod), by ``with_regularization`` below. It is
  added after the gradients were reduced over Horovod ranks, so it counts
  once, as in the plain model (every rank adds it, the average keeps it).
  This assumes what ``compile``/``fit`` do: ``model.losses`` enter the loss
  with weight 1. Without a hooked optimizer (a custom loop that never
  compiles) the gradient flows through TensorFlow as in Keras (dense).
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import save_context

from hybridtf._src.capture.regularizers import find_penalty


class PackedPenalty:
    """The callable loss of a packed member table: its regularizer on its rows of the packed variable."""

    def __init__(self, regularizer, view, storage, scope: str):
        self.regularizer = regularizer
        self.view = view
        self.storage = storage
        self.scope = scope

    def __call__(self):
        with tf.name_scope(self.scope):
            view = self.view
            if not self.storage.fold_regularization or view.sharded or save_context.in_save_context():
                rows = view.read_value()  # a slice: TensorFlow's gradient is dense, as in Keras
                return self.regularizer(rows if not self.storage.fold_regularization else tf.stop_gradient(rows))
            # A gather of the member's rows: after the step's sparse ops TensorFlow's ReadVariableOp
            # copies the whole packed variable, so a slice per member would copy it once per member.
            start = view.row_offset
            rows = view.packed_variable.sparse_read(tf.range(start, start + view.shape[0], dtype=tf.int64))
            return self.regularizer(tf.stop_gradient(rows))


def replace_penalty(layer, variable, view, storage) -> None:
    """Points ``layer``'s regularization loss of ``variable`` (its table) at the packed rows ``view``."""
    index = find_penalty(layer, variable)
    if index is None:
        return
    penalty = PackedPenalty(layer.embeddings_regularizer, view, storage, f"{layer.name}/embeddings/Regularizer")
    loss = layer._callable_losses[index]
    if isinstance(loss, functools.partial) and isinstance(loss.args[0], functools.partial):
        penalty = functools.partial(loss.func, penalty)  # keep Keras's add_loss wrapper (tags the tensor)
    layer._callable_losses[index] = penalty


def regularization_gradient(var, ranges, l1, l2):
    """``(rows, grad)``: Keras's regularizer gradient ``l1 * sign(w) + w * (2 * l2)`` on the ranges' rows."""
    rows = np.concatenate([np.arange(b, e, dtype=np.int64) for b, e in ranges])
    counts = (ranges[:, 1] - ranges[:, 0]).astype(np.int64)
    w = tf.gather(var, rows)
    f1 = tf.constant(np.repeat(l1, counts)[:, None], var.dtype)
    f2 = tf.constant(np.repeat(2 * l2, counts)[:, None], var.dtype)
    return rows, f1 * tf.sign(w) + w * f2


def with_regularization(grad, var, reg):
    """``grad`` of packed variable ``var`` plus the regularized ranges' gradient (for Keras's own update).

    An IndexedSlices gradient stays sparse: its rows plus every regularized
    row (duplicates summed, the batch gradient first), so the unregularized
    members keep Keras's sparse semantics (LazyAdam's untouched rows). A
    dense gradient gets the rows added in place.
    """
    ranges, l1, l2 = reg
    rows, values = regularization_gradient(var, ranges, l1, l2)
    shape = tf.shape(var, out_type=tf.int64)
    if grad is None:
        return tf.IndexedSlices(values, tf.constant(rows), dense_shape=shape)
    if not isinstance(grad, tf.IndexedSlices):
        return tf.tensor_scatter_nd_add(grad, rows[:, None], values)
    indices = tf.concat([tf.cast(grad.indices, tf.int64), rows], axis=0)
    unique, inverse = tf.unique(indices)
    summed = tf.math.unsorted_segment_sum(tf.concat([grad.values, values], 0), inverse, tf.size(unique))
    return tf.IndexedSlices(summed, unique, dense_shape=shape)

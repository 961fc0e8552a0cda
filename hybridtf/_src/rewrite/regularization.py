"""Embeddings regularizers of packed tables: the same penalty, the same gradient.

A Keras layer built with ``embeddings_regularizer=r`` adds the callable loss
``r(embeddings)`` to ``model.losses``; its gradient is dense over the table
(Keras then updates every row). For a packed member table:

* **Value.** The layer's callable loss is replaced by one that evaluates the
  same regularizer object on the member's rows of the packed variable (same
  values, same shape, so the same float result), so ``model.losses`` and the
  compiled loss are unchanged. Once the gradient is folded (below), the
  values of all L1/L2 members of a packed table come from one
  ``HybridTF>RegularizationPenalty`` op instead (``TablePenalties``: one read
  of the table, Keras's value within 1e-6 relative, no gradient).
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
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import save_context

from hybridtf._src.capture.regularizers import find_penalty, regularizer_spec
from hybridtf._src.run import regularized_apply


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
            penalties = table_penalties(self.storage, view)
            if penalties is not None:  # one fused read of the packed table for all its members
                return penalties.value(view.table)
            if regularizer_spec(self.regularizer) == (None, None):  # L1L2(0, 0): Keras's constant 0
                return tf.constant(0.0, view.dtype)
            # A gather of the member's rows: after the step's sparse ops TensorFlow's ReadVariableOp
            # copies the whole packed variable, so a slice per member would copy it once per member.
            start = view.row_offset
            rows = view.packed_variable.sparse_read(tf.range(start, start + view.shape[0], dtype=tf.int64))
            return self.regularizer(tf.stop_gradient(rows))


# Stateful ops that only read variables: a penalty computed before them is still current after them.
_READ_ONLY_OPS = frozenset(
    {
        "ReadVariableOp",
        "ResourceGather",
        "ResourceGatherNd",
        "VariableShape",
        "VarIsInitializedOp",
        "HybridTF>GatherRows",
        regularized_apply.PENALTY_OP,
    }
)


class TablePenalties:
    """The penalties of every regularized member of one packed table, from one ``RegularizationPenalty`` op.

    Keras evaluates ``model.losses`` one callable at a time. In a graph, the
    first member's call creates one op for all members (one read pass over
    the packed variable) and the next members read their element of it, as
    long as nothing that could write a variable was added to the graph in
    between (any stateful op other than a read): then the cached values are
    still the variable's current ones. Otherwise, and in eager execution
    (each call then reads only its member's rows), a new op reads the rows.
    """

    def __init__(self, variable, names, ranges, l1, l2):
        self.variable = variable
        self.index = {name: k for k, name in enumerate(names)}
        self.ranges, self.l1, self.l2 = ranges, l1, l2
        self._cached = None  # (graph, control flow context, mark, per-member tensors)

    def value(self, member: str) -> tf.Tensor:
        """The penalty of ``member`` (Keras's value of its regularizer), a float32 scalar with no gradient."""
        k = self.index[member]
        if tf.executing_eagerly():
            one = slice(k, k + 1)
            return self._op(self.ranges[one], self.l1[one], self.l2[one])[0]
        graph = tf.compat.v1.get_default_graph()
        context = graph._get_control_flow_context()
        cached = self._cached  # only the last graph's: at most one traced graph kept alive per packed table
        if cached is None or cached[0] is not graph or cached[1] is not context or not _unchanged(graph, cached[2]):
            cached = (graph, context, None, tf.unstack(self._op(self.ranges, self.l1, self.l2), len(self.index)))
        result = cached[3][k]
        self._cached = (graph, context, _mark(graph, result.op), cached[3])
        return result

    def _op(self, ranges, l1, l2):
        with tf.name_scope("packed_penalty"):
            return tf.stop_gradient(regularized_apply.regularization_penalty(self.variable, ranges, l1, l2))


def _mark(graph, last_op):
    """Where the graph stands after ``last_op`` (the op just created): its id and the graph's op count."""
    nodes = getattr(graph, "_nodes_by_id", None)
    return None if nodes is None else (last_op._id, len(nodes))


def _unchanged(graph, mark) -> bool:
    """Whether every op added to ``graph`` since ``mark`` is stateless or only reads variables."""
    nodes = getattr(graph, "_nodes_by_id", None)
    if nodes is None or mark is None:
        return False
    last_id, count = mark
    for i in range(last_id + 1, last_id + 1 + len(nodes) - count):
        if i not in nodes:  # ids were not handed out one by one: cannot tell
            return False
        op = nodes[i]
        if op._is_stateful and op.type not in _READ_ONLY_OPS:
            return False
    return True


_TABLE_PENALTIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def table_penalties(storage, view) -> TablePenalties | None:
    """The shared ``TablePenalties`` of ``view``'s packed table, or None where the fused op does not apply.

    It applies to a whole (unsharded) float32 packed table on the CPU whose
    member ``view.table`` has an L1/L2 penalty in ``storage.regularizers``.
    """
    if view.table not in storage.regularizers or view.dtype != tf.float32:
        return None
    var = view.packed_variable
    if "GPU" in (var.device or "").upper():
        return None
    packed_name, _ = storage.plan.location(view.table)
    tables = _TABLE_PENALTIES.setdefault(storage, {})
    if packed_name not in tables:
        members = sorted(
            (m for m in storage.plan.packed_table(packed_name).members if m.name in storage.regularizers),
            key=lambda m: m.row_offset,
        )
        specs = [storage.regularizers[m.name] for m in members]
        tables[packed_name] = TablePenalties(
            var,
            [m.name for m in members],
            np.array([[m.row_offset, m.row_offset + m.num_rows] for m in members], np.int64),
            np.array([s.l1 for s in specs], np.float32),
            np.array([s.l2 for s in specs], np.float32),
        )
    return tables[packed_name]


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

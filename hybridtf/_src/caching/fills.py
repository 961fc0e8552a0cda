"""Dynamic tables' distinct-rows buffers over the micro-batches of one training step.

A training lookup of a dynamic table (a ``DynamicEmbedding`` layer, or the packed store of an
optimized model's group) writes the distinct ids of its batch and their rows into buffer
variables; the output gathers from the rows buffer, so its gradient is the distinct rows'
gradient, which the table's fused update consumes. A plain step fills the buffers once.

A micro-batched step (``rewrite/micro_batch.py``) looks a table up once per micro-batch and
updates it once. Inside ``accumulating()`` (the step's scope) the first fill of a buffer
assigns it and every later fill in the same graph APPENDS to it: micro-batch ``i``'s output
gathers its own rows at their offset, so each micro-batch's gradient is an ``IndexedSlices`` at
those offsets and the micro-batches' gradients concatenate. Rows already in the buffer never
change, so a later read still finds them where an earlier micro-batch put them. The update then
sees the same id once per micro-batch that had it: ``distinct`` sums the gradient per distinct
id (per (member, id) pair in a packed store) in order of first occurrence, which is the order
of the whole batch's unique ids, and the one fused update runs on those. The store is not
written between the micro-batches (the update comes after all of them), so every micro-batch
reads the same row for an id, its initial row included (it depends only on the seed, the id
and the initializer); the counts of Algorithm 1 add up to the whole batch's. The statistics'
lookup count counts an id once per micro-batch that looked it up.

In TensorFlow 1 graphs (no automatic control dependencies) each append reads the buffers after
the previous fill's assignments (``control_dependencies``), and each output after its own.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import tensorflow as tf

_state = threading.local()

SHARDED_MESSAGE = (
    "dynamic table {name!r} is sharded over Horovod ranks, and micro-batches do not support sharded dynamic "
    "tables (each micro-batch's lookup would exchange ids with the other ranks' owners, whose buffers the one "
    "update reads once). Use micro_batches=1 under Horovod; interleave_groups (K-interleaving) works with them."
)


class _Scope:
    """One ``accumulating()`` scope (an identity token)."""


def _scope():
    return getattr(_state, "scope", None)


@contextlib.contextmanager
def accumulating():
    """The scope of one micro-batched step: buffers filled more than once append (see the module docstring)."""
    previous = _scope()
    _state.scope = _Scope()
    try:
        yield
    finally:
        _state.scope = previous


def active() -> bool:
    """True inside ``accumulating()``: lookups gather their rows (IndexedSlices gradients)."""
    return _scope() is not None


# owner -> (scope, graph (weak) or None eagerly, fills so far, the last fill's assignments). Kept after the
# scope ends: ``micro_batch_gradients`` returns before the caller's update, which asks ``repeated``.
_fills: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _record(owner):
    """``(fills, assignments)`` of ``owner``'s buffers in the current graph and scope, or ``(0, [])``."""
    scope, graph_ref, count, ops = _fills.get(owner, (None, None, 0, []))
    graph = _graph()
    if (graph_ref() if graph_ref is not None else None) is not graph:
        return scope, 0, []
    return scope, count, ops


def fill(owner, assignments) -> tuple:
    """Assigns (first fill) or appends (later fills in ``accumulating()``) each ``(variable, value)``.

    Args:
        owner: the table's layer, ``Tables`` entry or packed group (the buffers' owner).
        assignments: ``(variable, value)`` pairs, values of equal length along axis 0.

    Returns:
        ``(offset, ops)``: where this fill's rows start in the buffers (a scalar int32 tensor; None for
        a first fill: at 0) and the assignment ops, which reads of the filled buffers must follow.
    """
    scope = _scope()
    previous_scope, count, previous = _record(owner)
    if scope is None or previous_scope is not scope or count == 0:
        count, ops, offset = 0, [variable.assign(value) for variable, value in assignments], None
    else:
        with tf.control_dependencies(previous):
            olds = [variable.read_value() for variable, _ in assignments]
        offset = tf.shape(olds[0], out_type=tf.int32)[0]
        ops = [variable.assign(tf.concat([old, value], 0)) for (variable, value), old in zip(assignments, olds)]
    graph = _graph()
    # outside a scope no fill follows: the ops are not kept (they would keep their graph alive)
    _fills[owner] = (scope, None if graph is None else weakref.ref(graph), count + 1, ops if scope else [])
    return offset, ops


def repeated(owner) -> bool:
    """True when ``owner``'s buffers were filled more than once in this step (they may repeat ids)."""
    return _record(owner)[1] > 1


def distinct(ids, grad, members=None, records=None):
    """The buffers' rows summed per distinct id (or (member, id) pair), in order of first occurrence.

    Returns:
        ``(ids, grad, members, records)``, the last two None where not given.
    """
    if members is None:
        unique, position = tf.unique(ids, out_idx=tf.int32)
        kept_members = None
    else:
        pairs = tf.stack([members, ids], 1)
        unique_pairs, position = tf.raw_ops.UniqueV2(x=pairs, axis=tf.constant([0], tf.int64), out_idx=tf.int32)
        unique, kept_members = unique_pairs[:, 1], unique_pairs[:, 0]
    k = tf.shape(unique, out_type=tf.int32)[0]
    summed = tf.math.unsorted_segment_sum(grad, position, k)
    kept_records = None
    if records is not None:  # each pair's first occurrence's record hint (checked by the update as any hint)
        n = tf.shape(position, out_type=tf.int32)[0]
        first = tf.math.unsorted_segment_min(tf.range(n), position, k)
        kept_records = tf.gather(records, first)
    return unique, summed, kept_members, kept_records

"""Dynamic tables' distinct-rows buffers when a step looks a table up more than once.

A training lookup of a dynamic table (a ``DynamicEmbedding`` layer, a ``Tables`` dynamic table,
or the packed store of an optimized model's group) writes the distinct ids of its batch and their
rows into buffer variables; the output gathers from the rows buffer, so its gradient is the
distinct rows' gradient, which the table's fused update consumes.

A step may look a table up more than once before its update: once per micro-batch
(``rewrite/micro_batch.py``, ``micro_batch_gradients``), or a layer shared by two inputs. The
first fill of a step assigns the buffers and every later one APPENDS to them: its output gathers
its own rows at their offset, so each lookup's gradient is an ``IndexedSlices`` at those offsets
and the gradients add up. Rows already in the buffer never change, so a later read still finds
them where an earlier lookup put them. The update then sees an id once per lookup that had it:
``distinct`` sums the gradient per distinct id (per (member, id) pair in a packed store) in order
of first occurrence, which is the order of the whole batch's unique ids, and the one fused
update runs on those (``close`` then ends the step's fills). The store is not written between the
lookups (the update comes after all of them), so every lookup reads the same row for an id, its
initial row included (it depends only on the seed, the id and the initializer); the counts of
Algorithm 1 add up to the whole batch's. The statistics' lookup count counts an id once per
lookup that had it.

Where a step begins: in a graph (``tf.function``, Keras ``fit``, TF1), a fill appends when an
earlier fill of the same graph has not been consumed by an update traced since; each run of the
graph starts with the assigning fill. Eagerly there is no graph to tell steps apart (a step whose
update was skipped, e.g. by a loss scale, would leave its rows behind), so only fills inside one
``accumulating()`` scope (a micro-batched step) append. In TensorFlow 1 graphs (no automatic
control dependencies) each append reads the buffers after the previous fill's assignments
(``control_dependencies``), and each output after its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref

import tensorflow as tf

from hybridtf._src import thread_state

_state = threading.local()

SHARDED_MESSAGE = (
    "dynamic table {name} is sharded over Horovod ranks and is looked up more than once in one training step "
    "(micro-batches, or a layer called on two inputs). A sharded table's lookup exchanges ids with the other ranks' "
    "owners, whose buffers the one update reads once, so it supports one lookup per step: use micro_batches=1 "
    "under Horovod (interleave_groups works), and look all of a step's ids up in one call (tf.concat them and "
    "split the output)."
)


CAPACITY_MESSAGE = (
    "dynamic table {name} has a capacity (eviction) and is looked up more than once in one training step "
    "(micro-batches, or a layer called on two inputs). Eviction spares the rows the step has used so far, so an "
    "earlier lookup's inserts could evict rows a later lookup of the same step needs, which one lookup of all the "
    "step's ids never does. Use capacity=0 (unbounded; ttl_steps still drops old rows), micro_batches=1, or look "
    "all of a step's ids up in one call (tf.concat them and split the output)."
)


class _Scope:
    """One ``accumulating()`` scope (an identity token)."""


def _scope():
    return getattr(_state, "scope", None)


@contextlib.contextmanager
def accumulating():
    """The scope of one micro-batched step: eagerly too, fills after the first append (module docstring)."""
    with thread_state.setting(_state, "scope", _Scope()):
        yield


def active() -> bool:
    """True inside ``accumulating()``."""
    return _scope() is not None


@dataclasses.dataclass
class _Fills:
    """An owner's fills in its current step: the graph (weak; None eagerly), the eager scope, how many
    fills, the last one's assignments (kept while a later fill may follow), and whether the step's
    update has been traced since."""

    graph: object
    scope: object
    count: int
    ops: list
    open: bool = True


_fills: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _current(owner, enclosing: bool = False) -> _Fills | None:
    """``owner``'s fills in the current graph (or eagerly), or None. ``enclosing``: also fills of a graph
    that encloses the current one (an update traced in a ``tf.cond`` branch, as a loss scale's is)."""
    rec = _fills.get(owner)
    if rec is None:
        return None
    filled = rec.graph() if rec.graph is not None else None
    graph = _graph()
    while graph is not None and graph is not filled and enclosing:
        graph = getattr(graph, "outer_graph", None)
    return rec if graph is filled else None


def appends(owner) -> bool:
    """True when a training lookup of ``owner`` now would append to its buffers (see the module docstring)."""
    rec = _current(owner)
    if rec is None or not rec.open:
        return False
    if tf.executing_eagerly():
        return rec.scope is not None and rec.scope is _scope()
    return True


def fill(owner, assignments) -> tuple:
    """Assigns (a step's first fill) or appends (later ones) each ``(variable, value)``.

    Args:
        owner: the table's layer, ``Tables`` entry or packed group (the buffers' owner).
        assignments: ``(variable, value)`` pairs, values of equal length along axis 0.

    Returns:
        ``(offset, ops)``: where this fill's rows start in the buffers (a scalar int32 tensor; None for
        a first fill: at 0) and the assignment ops, which reads of the filled buffers must follow.
    """
    rec = _current(owner)
    if appends(owner):
        with tf.control_dependencies(rec.ops):
            olds = [variable.read_value() for variable, _ in assignments]
        offset = tf.shape(olds[0], out_type=tf.int32)[0]
        ops = [variable.assign(tf.concat([old, value], 0)) for (variable, value), old in zip(assignments, olds)]
        rec.count, rec.ops = rec.count + 1, ops
        return offset, ops
    ops = [variable.assign(value) for variable, value in assignments]
    graph = _graph()
    _fills[owner] = _Fills(None if graph is None else weakref.ref(graph), _scope(), 1, ops)
    return None, ops


def repeated(owner) -> bool:
    """True when ``owner``'s buffers were filled more than once in this step (they may repeat ids)."""
    rec = _current(owner, enclosing=True)
    return rec is not None and rec.count > 1


def close(owner) -> None:
    """The step's update of ``owner`` is traced (or ran, eagerly): the next fill starts a new step."""
    rec = _current(owner, enclosing=True)
    if rec is not None:
        rec.open, rec.ops = False, []


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

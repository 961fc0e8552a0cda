"""Tables a model_fn makes itself (``tf.compat.v1.get_variable``) and looks up with TensorFlow's own ops.

TF1 model_fns often hold their embeddings in plain variables::

    table = tf.compat.v1.get_variable("emb_C1", [vocab, dim], initializer=...)
    x = tf.nn.embedding_lookup(table, features["C1"])          # or tf.gather(table, ids)
    h = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="mean")

Nothing but its use says such a variable is a table. The record pass
(``estimator_record.Record``) therefore runs twice when a model_fn makes one:

1. The first run leaves every variable plain and notes the *candidates*: trainable ``float32``
   ``[rows, dim]`` variables created outside Keras layers, feature columns, ``Tables`` and
   partitioned variable scopes (``is_candidate``). Afterwards, ``looked_up_only`` reads the
   scratch graph: a candidate whose every read is a row gather (``ResourceGather``: ``embedding_lookup``,
   ``tf.gather``) or a sparse segment reduction (``embedding_lookup_sparse``,
   ``safe_embedding_lookup_sparse``), apart from its initializer, optimizer updates and savers, is a table.
2. The second run (and the real pass) gives those variables ``RawTable`` owners: the creator hands
   out ``CapturedTable`` views, packed like a Keras Embedding's table and checkpointed under the
   variable's own name. Any other use found then (a use the graph did not show) converts the view
   and leaves the table unpacked with the reason.

This module also dispatches the lookups such code calls, for any captured table: ``tf.gather``
(``axis=0``, ``batch_dims=0``), the v1 ``tf.compat.v1.nn.embedding_lookup`` (``tf.nn.embedding_lookup``
under ``import tensorflow.compat.v1``) and ``tf.nn.embedding_lookup_sparse`` (v1 and v2; unweighted,
no ``max_norm``). The last gives TensorFlow's result: one row per example up to the last example with
an id (an example without ids in between gives a zero row), the mean / sum / sqrtn of its rows.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import tensorflow as tf

from hybridtf._src.capture.lookup_api import Tables, prepare_ids
from hybridtf._src.integrations import estimator_columns as columns
from hybridtf._src.integrations.estimator_capture import CapturedTable, _frame_locals, frame_owner

SEGMENT_REDUCTIONS = frozenset(
    {
        "SparseSegmentSum",
        "SparseSegmentMean",
        "SparseSegmentSqrtN",
        "SparseSegmentSumWithNumSegments",
        "SparseSegmentMeanWithNumSegments",
        "SparseSegmentSqrtNWithNumSegments",
    }
)
_SAVES = frozenset({"SaveV2", "SaveSlices", "Save"})


@dataclasses.dataclass(eq=False)
class RawTable:
    """The owner of a table the model_fn made as a plain variable: stands for the layer a table belongs to.

    Attributes:
        name: the table's name, the variable's full name (``deep/emb_C1``).
        trainable: whether the variable is trainable.
    """

    name: str
    trainable: bool = True
    kind: str = "get_variable"


def full_name(kwargs) -> str | None:
    """The full name of the variable a creator's ``kwargs`` make (``get_variable`` names are absolute)."""
    name = kwargs.get("name")
    if not isinstance(name, str):
        return None
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return f"{scope}/{name}" if scope else name


def is_candidate(kwargs) -> bool:
    """Whether the variable a creator's ``kwargs`` make could be a table of the model_fn's own.

    A trainable float32 ``[rows, dim]`` variable with a known shape, not a Keras layer's (or another
    ``tf.Module``'s) weight, not a ``Tables`` set's, not one part of a partitioned variable and without a
    constraint.
    """
    if kwargs.get("trainable") is False or kwargs.get("constraint") is not None:
        return False
    shape = kwargs.get("shape")
    if shape is None:
        return False
    shape = tf.TensorShape(shape)
    if shape.rank != 2 or not shape.is_fully_defined():
        return False
    if tf.as_dtype(kwargs.get("dtype") or tf.float32) != tf.float32:
        return False
    if (
        frame_owner("__init__", Tables) is not None
        or next(_frame_locals("_get_partitioned_variable"), None) is not None
    ):
        return False
    return not _inside_module()


def _inside_module(max_depth: int = 60) -> bool:
    """Whether a method of a ``tf.Module`` (a Keras layer's ``add_weight`` / ``build`` / ``call``) is on the stack.

    A variable such a method makes is the module's: it tracks the variable itself (a view in its place would
    leave its ``trainable_variables``), so it is never captured as a table of the model_fn's own.
    """
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return False
        if isinstance(frame.f_locals.get("self"), tf.Module):
            return True
        frame = frame.f_back
    return False


def _read_is_lookup(read: tf.Operation) -> bool:
    """Whether every use of a ``ReadVariableOp``'s value is a sparse segment reduction's rows or a save."""
    for consumer in read.outputs[0].consumers():
        if consumer.type in SEGMENT_REDUCTIONS and consumer.inputs[0] is read.outputs[0]:
            continue
        if consumer.type == "Identity" and all(c.type in _SAVES for c in consumer.outputs[0].consumers()):
            continue
        if consumer.type in _SAVES:
            continue
        return False
    return True


def looked_up_only(variable) -> bool:
    """Whether the graph reads resource ``variable`` only by rows (gathers, sparse segment reductions), at least once.

    Its initializer, shape, optimizer updates (which write it through its handle) and savers do not count.
    """
    handle = getattr(variable, "handle", None)
    if not isinstance(handle, tf.Tensor) or handle.op.type != "VarHandleOp":
        return False
    looked_up = False
    for consumer in handle.consumers():
        if consumer.type == "ResourceGather":
            looked_up = True
        elif consumer.type == "ReadVariableOp":
            if not consumer.outputs[0].consumers():
                continue
            if not _read_is_lookup(consumer):
                return False
            looked_up = looked_up or any(c.type in SEGMENT_REDUCTIONS for c in consumer.outputs[0].consumers())
    return looked_up


def raw_owner(kwargs, names) -> RawTable | None:
    """The ``RawTable`` owning the variable a creator's ``kwargs`` make, if it is one of ``names``, else None."""
    if not names:
        return None
    name = full_name(kwargs)
    if name not in names or not is_candidate(kwargs):
        return None
    return RawTable(name, kwargs.get("trainable") is not False)


# -- lookups of captured tables by TensorFlow's own ops ---------------------------------------------------
def _int_ids(ids) -> bool:
    base = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    return isinstance(base, tf.Tensor) and base.dtype in (tf.int32, tf.int64)


def _is_zero(value) -> bool:
    """Whether a Python (or NumPy) argument is None or 0 (a tensor is neither)."""
    return value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0)


@tf.experimental.dispatch_for_api(tf.compat.v1.gather, {"params": CapturedTable})
def _gather(params, indices, validate_indices=None, name=None, axis=None, batch_dims=0):
    if _is_zero(axis) and _is_zero(batch_dims) and _int_ids(indices):
        return params.lookup(indices, "none")
    why = f"tf.gather(axis={axis}, batch_dims={batch_dims})" if _int_ids(indices) else "tf.gather of non-integer ids"
    rows = columns._unpacked(params, why)
    return tf.compat.v1.gather(rows, indices, name=name, axis=axis, batch_dims=batch_dims)


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup, {"params": CapturedTable})
def _embedding_lookup_v1(params, ids, partition_strategy="mod", name=None, validate_indices=True, max_norm=None):
    return tf.nn.embedding_lookup(params, ids, max_norm=max_norm, name=name)  # one table: no partitions


def _segments(sp_ids: tf.SparseTensor):
    """Ragged bags of ``sp_ids`` as ``embedding_lookup_sparse`` groups them: by the first index, rows up to the last.

    The ids are put in index order first (TensorFlow's reduction requires it and fails otherwise).
    """
    sp_ids = tf.sparse.reorder(sp_ids)
    segments = sp_ids.indices[:, 0]
    rows = tf.reduce_max(tf.concat([segments + 1, tf.zeros([1], tf.int64)], 0))
    lengths = tf.raw_ops.DenseBincount(input=segments, size=rows, weights=tf.zeros([0], tf.int64), binary_output=False)
    return tf.RaggedTensor.from_row_lengths(sp_ids.values, lengths, validate=False)


def _sparse_lookup(table: CapturedTable, sp_ids, sp_weights, combiner, max_norm, plain):
    combiner = combiner or "mean"
    reason = columns._unpacked_reason(sp_ids, sp_weights, combiner, max_norm)
    if reason is not None:
        return plain(columns._unpacked(table, f"it is looked up through tf.nn.embedding_lookup_sparse with {reason}"))
    bags = _segments(sp_ids)
    return table.lookup(prepare_ids(bags, combiner, table.table), combiner)


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup_sparse, {"params": CapturedTable})
def _embedding_lookup_sparse_v1(
    params,
    sp_ids,
    sp_weights,
    partition_strategy="mod",
    name=None,
    combiner=None,
    max_norm=None,
    allow_fast_lookup=False,
):
    def plain(rows):
        return tf.compat.v1.nn.embedding_lookup_sparse(
            rows, sp_ids, sp_weights, partition_strategy, name, combiner, max_norm, allow_fast_lookup
        )

    return _sparse_lookup(params, sp_ids, sp_weights, combiner, max_norm, plain)


__all__ = ["RawTable", "full_name", "is_candidate", "looked_up_only", "raw_owner"]

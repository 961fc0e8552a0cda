"""Tables a model_fn makes itself (``tf.compat.v1.get_variable``) and looks up with TensorFlow's own ops.

TF1 model_fns often hold their embeddings in plain variables::

    table = tf.compat.v1.get_variable("emb_C1", [vocab, dim], initializer=...)
    x = tf.nn.embedding_lookup(table, features["C1"])          # or tf.gather(table, ids)
    h = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="mean")

Nothing but its use says such a variable is a table. The record pass
(``estimator_record.Record``) therefore runs twice when a model_fn makes one:

1. The first run leaves every variable plain and notes the *candidates* (``is_candidate``): float32
   ``[rows, dim]`` variables (by ``shape=`` or an array initial value; resource or reference) made
   outside ``tf.Module`` and optimizer methods, ``Tables`` and partitioned variable scopes, without a
   constraint. Afterwards, ``table_use`` reads the scratch graph: a candidate whose every use is a row
   gather (``embedding_lookup``, ``tf.gather``) or, through a read, a sparse segment reduction
   (``embedding_lookup_sparse``, ``safe_embedding_lookup_sparse``), apart from its initializer, restores,
   optimizer updates and savers, is a table. A frozen one, or one also read inside control flow, is
   reported with the reason instead.
2. The second run (and the real pass) gives the trainable tables ``RawTable`` owners: the creator hands
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

import numpy as np
import tensorflow as tf

from hybridtf._src.capture.lookup_api import Tables, prepare_ids
from hybridtf._src.integrations import estimator_columns as columns
from hybridtf._src.integrations.estimator_capture import CapturedTable, _frame_locals, declared_shape, frame_owner

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


def full_name(kwargs) -> str | None:
    """The full name of the variable a creator's ``kwargs`` make (``get_variable`` names are absolute)."""
    name = kwargs.get("name")
    if not isinstance(name, str):
        return None
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return f"{scope}/{name}" if scope else name


def _declared_dtype(kwargs) -> tf.DType:
    dtype = kwargs.get("dtype")
    init = kwargs.get("initial_value")
    if dtype is None and isinstance(init, (tf.Tensor, np.ndarray)):
        dtype = init.dtype
    return tf.as_dtype(dtype or tf.float32).base_dtype


def is_candidate(kwargs) -> bool:
    """Whether the variable a creator's ``kwargs`` make could be a table of the model_fn's own.

    A float32 ``[rows, dim]`` variable with a known shape, not a Keras layer's (or another ``tf.Module``'s)
    weight, not an optimizer's slot, not a ``Tables`` set's, not one part of a partitioned variable and
    without a constraint. A frozen one (``trainable=False``) is a candidate too: it is reported, not packed.
    """
    if kwargs.get("constraint") is not None:
        return False
    shape = declared_shape(kwargs)
    if shape.rank != 2 or not shape.is_fully_defined() or _declared_dtype(kwargs) != tf.float32:
        return False
    if (
        frame_owner("__init__", Tables) is not None
        or next(_frame_locals("_get_partitioned_variable"), None) is not None
    ):
        return False
    return not _inside_owner()


def _optimizer_types() -> tuple:
    from keras.src.optimizers.legacy.optimizer_v2 import OptimizerV2
    from keras.src.optimizers.optimizer import Optimizer

    return (tf.Module, tf.compat.v1.train.Optimizer, OptimizerV2, Optimizer)


def _inside_owner(max_depth: int = 60) -> bool:
    """Whether a method of a ``tf.Module`` (a Keras layer's ``add_weight`` / ``build`` / ``call``) or of an
    optimizer (its slots) is on the stack.

    A variable a module makes is the module's: it tracks the variable itself (a view in its place would
    leave its ``trainable_variables``), so it is never captured as a table of the model_fn's own.
    """
    owners = _optimizer_types()
    return any(isinstance(f.get("self"), owners) for f in _frame_locals(None, max_depth))


# -- how the record graph reads a candidate ----------------------------------------------------------------
_STATE_OPS = frozenset(
    {"VarIsInitializedOp", "IsVariableInitialized", "VariableShape", "AssignVariableOp", "Assign", "DestroyResourceOp"}
)
_CONTROL_FLOW = frozenset(
    {"If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall", "StatefulPartitionedCall", "Case"}
    | {"Switch", "Enter", "RefSwitch", "RefEnter"}  # TF1 control flow
)
LOOKUP, STATE, CONTROL_FLOW, OTHER = "lookup", "state", "control_flow", "other"
CONTROL_FLOW_REASON = (
    "it is read inside tf.cond / tf.while_loop / a tf.function, where hybridtf does not follow it: exact, but "
    "unpacked; look it up outside the control flow (e.g. compute both branches' ids, then one lookup) to pack it"
)


def _gathers_rows(op: tf.Operation, t: tf.Tensor) -> bool:
    """Whether ``op`` gathers whole rows of ``t`` (its params): axis 0, no batch dims."""
    if not op.inputs or op.inputs[0] is not t:
        return False
    if op.type == "Gather":
        return True
    if op.type == "ResourceGather":
        return op.get_attr("batch_dims") == 0
    if op.type == "GatherV2":
        return tf.get_static_value(op.inputs[2]) == 0 and op.get_attr("batch_dims") == 0
    return False


def _value_use(op: tf.Operation, value: tf.Tensor) -> str:
    """How ``op`` uses a read of the variable's whole value."""
    if _gathers_rows(op, value) or (op.type in SEGMENT_REDUCTIONS and op.inputs[0] is value):
        return LOOKUP
    if op.type in _SAVES or (op.type == "Identity" and all(c.type in _SAVES for c in op.outputs[0].consumers())):
        return STATE
    if op.type in _CONTROL_FLOW:
        return CONTROL_FLOW
    return OTHER


def _use(op: tf.Operation, source: tf.Tensor) -> str:
    """How ``op`` uses the variable's handle (or reference) ``source``."""
    if _gathers_rows(op, source):
        return LOOKUP
    if op.type in _STATE_OPS or "/update_" in op.name:  # initializer, restore, an optimizer's update
        return STATE
    if op.type in _CONTROL_FLOW:
        return CONTROL_FLOW
    if op.type in ("ReadVariableOp", "Identity"):  # a read: each use of its value counts
        uses = {_value_use(c, op.outputs[0]) for c in op.outputs[0].consumers()}
        for kind in (OTHER, CONTROL_FLOW, LOOKUP):
            if kind in uses:
                return kind
        return STATE
    return OTHER


def table_use(variable) -> str:
    """How the graph reads ``variable``: ``"lookup"`` (only by rows — gathers, sparse segment reductions — at
    least once), ``"control_flow"`` (else by rows, but also inside ``tf.cond`` / ``tf.while_loop`` / a
    ``tf.function``, which hybridtf does not follow), or ``""`` (another use, or not looked up).

    Its initializer, shape, restores, optimizer updates and savers do not count.
    """
    op = getattr(variable, "op", None)
    if op is None or op.type not in ("VarHandleOp", "VariableV2") or not op.outputs:
        return ""
    source = op.outputs[0]
    uses = {_use(c, source) for c in source.consumers()}
    if OTHER in uses:
        return ""
    if CONTROL_FLOW in uses:
        return CONTROL_FLOW
    return LOOKUP if LOOKUP in uses else ""


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
    return columns.bags_by_row(sp_ids.values, segments, rows)


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


__all__ = ["SEGMENT_REDUCTIONS", "RawTable", "declared_shape", "full_name", "is_candidate", "raw_owner", "table_use"]

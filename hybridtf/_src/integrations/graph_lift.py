"""Copying the ops that compute lookups' ids from a scratch record-pass graph into the real step.

Shared by ``hybridtf.function`` (a custom step's record pass) and ``keras_record`` (an optimized
model's forward pass when its ids are computed inside the model): ``side_effect_op`` finds an op
with side effects among the ops computing some ids (it would run twice: once copied, once in the
real pass), ``lift_ids`` copies the ids' ops into the real graph, fed by the same arguments and
captured values (``tf.__internal__.lift_to_graph``), and ``GraphNotedRequests`` notes the graph
each lookup was recorded in (a lookup under control flow is in a nested graph).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.util import object_identity

from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.run.gather_rows import OP_NAME as GATHER_ROWS

# Op types that gather rows of a resource variable (input 0 is its handle).
GATHER_OPS = frozenset({"ResourceGather", "ResourceGatherNd", GATHER_ROWS})

# Stateful op types that only read: allowed where ids are computed, and not
# counted as writes to a table.
READ_ONLY_OPS = GATHER_OPS | frozenset(
    {
        "ReadVariableOp",
        "VariableShape",
        "VarIsInitializedOp",
        "LookupTableFindV2",
        "LookupTableSizeV2",
    }
)


def is_random_op(op) -> bool:
    """A (seeded) random op: ``RandomUniform``, ``TruncatedNormal``, ``Multinomial``, ``RandomShuffle``, ..."""
    return "Random" in op.type or op.type in ("TruncatedNormal", "ParameterizedTruncatedNormal", "Multinomial")


def components(ids) -> list:
    return tf.nest.flatten(ids, expand_composites=True)


def has_function_attr(op) -> bool:
    for value in op.node_def.attr.values():
        if value.HasField("func") or len(value.list.func):
            return True
    return False


def side_effect_op(tensors, scratch):
    """``(op, calls)``: an op with side effects (or a placeholder) ``tensors`` are computed from, or None, and
    whether their ops call functions (whose definitions a copy needs). Captured values count as inputs."""
    captured = object_identity.ObjectIdentitySet(scratch.internal_captures)
    seen, stack, calls = set(), [t.op for t in tensors if t not in captured], False
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type in ("Placeholder", "PlaceholderWithDefault") or (op._is_stateful and op.type not in READ_ONLY_OPS):
            return op, calls
        calls = calls or has_function_attr(op)
        for t in op.inputs:
            if t not in captured:
                stack.append(t.op)
        stack.extend(op.control_inputs)
    return None, calls


class GraphNotedRequests(list):
    """A recorder's request list that also notes the graph each lookup was issued in."""

    def __init__(self):
        super().__init__()
        self.graphs = []

    def append(self, request):
        self.graphs.append(ops.get_default_graph())
        super().append(request)


def lift_ids(requests, scratch, real, check=None) -> list[LookupRequest]:
    """The recorded requests with their ids copied from the scratch graph into the real graph.

    ``check(request, index, tensors, scratch)`` validates each lookup's ids (raising) and returns
    whether their ops call functions; without it the caller has checked them (``side_effect_op``).
    """
    to_lift, calls = [], False
    for index, request in enumerate(requests):
        mine = [t for t in components(request.ids) if getattr(t, "graph", None) is scratch]
        calls = (check(request, index, mine, scratch) if check else side_effect_op(mine, scratch)[1]) or calls
        to_lift.extend(mine)
    op_map = object_identity.ObjectIdentityDictionary()
    if to_lift:
        if calls:
            for fn in list(scratch._functions.values()):
                if not real._is_function(fn.name):
                    real._add_function_recursive(fn)
        op_map = tf.__internal__.lift_to_graph(
            to_lift, real, add_sources=True, handle_captures=True, base_graph=scratch
        )
        for t in to_lift:  # static shapes Python code set (set_shape) are not part of the copied ops
            copy = op_map.get(t)
            if isinstance(copy, tf.Tensor) and copy.shape.is_compatible_with(t.shape):
                copy.set_shape(t.shape)
    lifted = []
    for request in requests:
        parts = [op_map.get(t, t) if getattr(t, "graph", None) is scratch else t for t in components(request.ids)]
        ids = tf.nest.pack_sequence_as(request.ids, parts, expand_composites=True)
        lifted.append(dataclasses.replace(request, ids=ids))
    return lifted

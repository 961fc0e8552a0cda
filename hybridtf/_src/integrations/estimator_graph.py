"""Graph helpers of the Estimator wrapper: stand-in inputs, copying id computations, op counts."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.util import object_identity

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.integrations.graph_lift import is_random_op
from hybridtf._src.run.gather_rows import OP_NAME as GATHER_ROWS

# Ops whose copy into the real graph would not compute the same values.
_RESOURCE_OPS = frozenset(
    {"VarHandleOp", "ReadVariableOp", "ResourceGather", GATHER_ROWS, "HashTableV2", "MutableHashTableV2"}
)


def stand_in_inputs(structure, prefix: str):
    """Placeholders in the current graph shaped like the tensors of ``structure`` (composites expanded).

    Returns:
        ``(stand_in_structure, pairs)`` with ``pairs`` = [(placeholder, real tensor)].
    """
    if structure is None:
        return None, []
    flat = tf.nest.flatten(structure, expand_composites=True)
    new, pairs = [], []
    for i, t in enumerate(flat):
        if isinstance(t, tf.Tensor):
            p = tf.compat.v1.placeholder(t.dtype, t.shape, name=f"{prefix}_{i}")
            new.append(p)
            pairs.append((p, t))
        else:
            new.append(t)
    return tf.nest.pack_sequence_as(structure, new, expand_composites=True), pairs


def _ancestors(tensors, stop) -> list:
    """Ops computing ``tensors`` (not past ``stop`` tensors), inputs before consumers."""
    order, state = [], {}
    stack = [(t.op, False) for t in tensors if t not in stop]
    while stack:
        op, done = stack.pop()
        if done:
            if state.get(op) != 2:
                state[op] = 2
                order.append(op)
            continue
        if op in state:
            continue
        state[op] = 1
        stack.append((op, True))
        for t in op.inputs:
            if t not in stop and t.op not in state:
                stack.append((t.op, False))
        for c in op.control_inputs:
            if c not in state:
                stack.append((c, False))
    return order


def liftable_problem(tensors, op_map, allow_random: bool = False) -> str | None:
    """Why the ops computing ``tensors`` cannot be copied into the real graph (None: they can)."""
    for op in _ancestors(tensors, op_map):
        if op in op_map:
            continue
        if op.type in ("Placeholder", "PlaceholderWithDefault"):
            return f"they depend on placeholder {op.name!r}, which is not one of the model_fn's features or labels"
        if op.type in _RESOURCE_OPS or any(t.dtype == tf.resource for t in op.inputs):
            return f"they read op {op.name!r} ({op.type}) of a variable or resource created in the model_fn"
        if op._is_stateful and not (allow_random and is_random_op(op)):
            return f"they depend on op {op.name!r} ({op.type}), which has side effects"
    return None


def copy_to_graph(tensors, op_map, source, target, scope: str) -> list:
    """Copies the ops computing ``tensors`` from graph ``source`` into ``target``.

    Args:
        tensors: tensors of ``source``.
        op_map: tensor/op of ``source`` -> tensor/op of ``target``; seeded with
            the stand-in inputs, extended with every copied op (so later
            calls reuse copies).
        source: the graph the tensors live in.
        target: the graph to copy into (the default graph while copying).
        scope: top-level name scope of the copies, each named ``scope/<its source op's full name>``: an
            error of a copied op names the layer whose ops it copies (``hybridtf_ids/deep/emb_C2/Cast``),
            wherever the copy is made (the ids of every table are copied at the first lookup).

    Returns:
        The copies of ``tensors``.
    """
    with target.as_default(), target.name_scope(None), tf.name_scope(scope):
        for op in _ancestors(tensors, op_map):
            if op in op_map:
                continue
            for attr in op.node_def.attr.values():
                funcs = [attr.func] if attr.HasField("func") else list(attr.list.func)
                for f in funcs:
                    fn = source._get_function(f.name)
                    if fn is not None and not target._is_function(f.name):
                        target._add_function_recursive(fn)
            attrs = {k: v for k, v in op.node_def.attr.items() if k != "_class"}
            with ops.control_dependencies([op_map[c] for c in op.control_inputs]):
                new = target._create_op_internal(
                    op.type,
                    [op_map[t] for t in op.inputs],
                    [t.dtype for t in op.outputs],
                    name=op.name,
                    attrs=attrs,
                    op_def=op.op_def,
                )
            op_map[op] = new
            for old_t, new_t in zip(op.outputs, new.outputs):
                new_t.set_shape(old_t.shape)
                op_map[old_t] = new_t
    return [op_map[t] for t in tensors]


def new_op_map(pairs) -> object_identity.ObjectIdentityDictionary:
    """An op map seeded with (stand-in placeholder, real tensor) pairs."""
    op_map = object_identity.ObjectIdentityDictionary()
    for placeholder, real in pairs:
        op_map[placeholder] = real
    return op_map


def step_ops(fetches) -> int:
    """Number of ops a session run of ``fetches`` can execute (their inputs and control inputs, transitively)."""
    return len(step_op_set(fetches))


def step_op_set(fetches) -> set:
    """The ops a session run of ``fetches`` can execute (their inputs and control inputs, transitively)."""
    roots = []
    for f in tf.nest.flatten(fetches, expand_composites=True):
        if isinstance(f, tf.Operation):
            roots.append(f)
        elif isinstance(f, tf.Tensor):
            roots.append(f.op)
        elif isinstance(f, tf.Variable):
            roots.append(f.op)
    seen, stack = set(), roots
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def batch_size_tensor(features):
    """``[batch]`` of the first tensor-like feature (int64 scalar), or None."""
    flat = tf.nest.flatten(features)
    for f in flat:
        if isinstance(f, tf.SparseTensor):
            return f.dense_shape[0]
        if isinstance(f, tf.RaggedTensor):
            return f.nrows(out_type=tf.int64)
        if isinstance(f, tf.Tensor) and f.shape.rank and f.shape.rank >= 1:
            return tf.shape(f, out_type=tf.int64)[0]
    return None


def check_top_level(requests, graphs, graph) -> None:
    for index, (request, g) in enumerate(zip(requests, graphs)):
        if g is not graph:
            raise CaptureError(
                f"hybridtf.estimator: lookup #{index} (table {request.table!r}) runs inside tf.cond, tf.while_loop "
                "or a tf.function in the model_fn; hybridtf.embedding.Tables lookups must be at the top level of "
                "the model_fn."
            )

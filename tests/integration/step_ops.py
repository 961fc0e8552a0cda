"""The traced training step of a compiled Keras model (for ops present/absent checks)."""

from __future__ import annotations

import tensorflow as tf


def step_graph(model, batches) -> tf.Graph:
    """``model.train_function``'s graph, after one step on ``batches[0]``."""
    x, y = batches[0]
    model.train_on_batch(x, y)  # builds train_function
    return model.train_function.get_concrete_function(iter(tf.data.Dataset.from_tensors((x, y)).repeat())).graph


def step_op_types(model, batches) -> list[str]:
    """Types of every op in ``model.train_function``'s graph, after one step on ``batches[0]``."""
    return [op.type for op in step_graph(model, batches).get_operations()]


def live_op_types(model, batches) -> list[str]:
    """Like ``step_op_types``, without ops none of whose outputs is used (TensorFlow prunes those before running)."""
    ops = step_graph(model, batches).get_operations()
    return [op.type for op in ops if not op.outputs or any(t.consumers() for t in op.outputs)]


def pruned_op_types(model, batches) -> list[str]:
    """Like ``step_op_types``, for the ops TensorFlow runs: those the step's outputs or control outputs need.

    A rewrite replaces the user's ops (a ``ConcatV2``, a chain of ``AddV2``) by fused ones; the originals stay in
    the traced graph without a consumer that matters, and TensorFlow prunes them before the step runs.
    """
    return graph_pruned_op_types(step_graph(model, batches))


def graph_pruned_op_types(graph: tf.Graph) -> list[str]:
    """Types of the ops of a step's graph that its outputs or control outputs need (see ``pruned_op_types``)."""
    return [op.type for op in graph_pruned_ops(graph)]


def graph_pruned_ops(graph: tf.Graph) -> list[tf.Operation]:
    """The ops of a step's graph that its outputs or control outputs need (see ``pruned_op_types``)."""
    stack = [t.op for t in graph.outputs] + list(graph.control_outputs)
    seen = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op.name in seen]

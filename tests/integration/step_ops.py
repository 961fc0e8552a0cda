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

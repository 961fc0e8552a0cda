"""The op types of a compiled Keras model's traced training step (for ops present/absent checks)."""

from __future__ import annotations

import tensorflow as tf


def step_op_types(model, batches) -> list[str]:
    """Types of every op in ``model.train_function``'s graph, after one step on ``batches[0]``."""
    x, y = batches[0]
    model.train_on_batch(x, y)  # builds train_function
    graph = model.train_function.get_concrete_function(iter(tf.data.Dataset.from_tensors((x, y)).repeat())).graph
    return [op.type for op in graph.get_operations()]

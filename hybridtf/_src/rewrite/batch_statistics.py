"""Statistics over the batch inside a micro-batched step: noticed in the traced graph, warned once.

A micro-batch sees only its own rows, so anything computed over the batch dimension (batch
normalization in training mode, ``tf.nn.moments(x, [0])`` in a hand-written normalization, batch-wise
softmax) differs from the whole step. hybridtf refuses the Keras layers it can name
(``micro_batch.check_layers``); this scan finds the ops such code leaves in the first micro-batch's
graph: a fused batch normalization in training mode (not the per-row one of Keras's
``LayerNormalization``), and a ``tf.nn.moments`` mean over axis 0. Other batch-dependent math
stays the caller's to avoid (documented).
"""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf
from tensorflow.python.framework import ops

_log = logging.getLogger("hybridtf")
_FUSED_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_told: set[tuple[str, tuple[str, ...]]] = set()


def batch_statistics_ops(operations) -> list[str]:
    """The names of ``operations`` that compute statistics over the batch (first) dimension."""
    found = []
    for op in operations:
        if op.type in _FUSED_BATCH_NORMS:
            # Keras's LayerNormalization runs one on its input reshaped to [1, rows, ..., 1] (NCHW): statistics per
            # row, its first dimension statically 1; a batch's first dimension is not (a micro-batch's unknown)
            shape = op.inputs[0].shape
            if op.get_attr("is_training") and not (shape.rank and shape[0] == 1):
                found.append(op.name)
        elif op.type == "Mean" and op.name.split("/")[-2:-1] == ["moments"]:
            axes = tf.get_static_value(op.inputs[1])
            rank = op.inputs[0].shape.rank
            if axes is not None and rank and any(int(a) % rank == 0 for a in tf.nest.flatten(axes.tolist())):
                found.append(op.name)
    return found


@contextlib.contextmanager
def noted(where: str, enabled: bool = True):
    """Warns once per (``where``, ops) when the block (a micro-batch's forward pass and loss, traced) creates
    ops that compute statistics over the batch; nothing eagerly (no graph to read) or unless ``enabled``."""
    if not enabled or tf.executing_eagerly():
        yield
        return
    graph = ops.get_default_graph()
    start = len(graph.get_operations())
    yield
    found = tuple(batch_statistics_ops(graph.get_operations()[start:]))
    if found and (where, found) not in _told:
        _told.add((where, found))
        _log.warning(
            "hybridtf: %s computes statistics over the batch in each micro-batch (ops %s: a batch normalization in "
            "training mode, or tf.nn.moments over axis 0): a micro-batch normalizes with its own rows' statistics, "
            "so the step differs from the whole batch's. Call such layers with training=False (moving statistics), "
            "compute the statistics before the micro-batched part (interleave_from after them), or use "
            "micro_batches=1.",
            where,
            ", ".join(found[:5]) + (", ..." if len(found) > 5 else ""),
        )

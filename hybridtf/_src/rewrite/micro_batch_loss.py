"""The loss each micro-batch of a micro-batched Keras step takes its gradient of (``micro_batch``,
``micro_batch_split``): its share of the whole step's loss.

Means over the batch are weighted by the micro-batch's share of the batch, ``reduction="sum"`` losses by 1
(``micro_batch.loss_weights``); with sums, the model's own batch-independent losses (weight regularizers),
which every micro-batch's ``compute_loss`` adds whole, are kept at ``1 / N`` each. A ``LossScaleOptimizer``'s
loss scale is applied per micro-batch and taken off the summed gradients.
"""

from __future__ import annotations

import tensorflow as tf
from keras.src.utils import losses_utils

from hybridtf._src.errors import InterleavingError


def sums_over_batch(model) -> bool:
    """Whether the compiled losses are ``reduction="sum"`` ones (else means over the batch).

    Raises:
        MicroBatchError: a loss with reduction NONE, or outputs whose losses mix sums and means (one weight
            per micro-batch cannot serve both).
    """
    compiled = getattr(model, "compiled_loss", None)
    # Keras flattens the compiled losses when they are first called; before that they are the user's own.
    losses = [obj for obj in tf.nest.flatten(getattr(compiled, "_losses", None)) if obj is not None]
    reductions = {getattr(obj, "reduction", losses_utils.ReductionV2.AUTO) for obj in losses}
    if losses_utils.ReductionV2.NONE in reductions:
        raise InterleavingError("a compiled loss with reduction NONE has no per-step value to micro-batch.")
    summed = bool(reductions) and reductions <= {losses_utils.ReductionV2.SUM}
    if losses_utils.ReductionV2.SUM in reductions and not summed:
        raise InterleavingError(
            "the compiled losses mix reduction='sum' and means over the batch: a micro-batch's sum counts whole, "
            "its mean by its share of the batch, and one step cannot weight both. Give every output the same "
            "reduction, or use micro_batches=1."
        )
    return summed


def step_loss(model, loss, weight, num_micro_batches: int) -> tf.Tensor:
    """A micro-batch's share of the step's loss (what its gradient is taken of), inside its tape.

    ``loss * weight``; with ``reduction="sum"`` losses (weight 1) the model's own losses (weight
    regularizers, batch-independent, in each micro-batch's ``compute_loss``) would count once per
    micro-batch, so each micro-batch keeps ``1 / N`` of them. A ``LossScaleOptimizer``'s loss scale is
    applied here and taken off the summed gradients (``unscaled_gradients``), as its ``minimize`` does.
    """
    scaled = loss * tf.cast(weight, loss.dtype)
    if num_micro_batches > 1 and model.losses and sums_over_batch(model):
        regularization = tf.add_n([tf.cast(term, loss.dtype) for term in model.losses])
        scaled = scaled - (1.0 - 1.0 / num_micro_batches) * regularization
    optimizer = getattr(model, "optimizer", None)
    if hasattr(optimizer, "get_scaled_loss"):
        scaled = optimizer.get_scaled_loss(scaled)
    return scaled


def unscaled_gradients(model, grads: list) -> list:
    """The gradients of ``step_loss``-scaled losses without a ``LossScaleOptimizer``'s loss scale."""
    optimizer = getattr(model, "optimizer", None)
    if not hasattr(optimizer, "get_unscaled_gradients"):
        return grads
    return optimizer.get_unscaled_gradients(grads)

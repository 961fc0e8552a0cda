"""The loss each micro-batch of a micro-batched Keras step takes its gradient of (``micro_batch``,
``micro_batch_split``): its share of the whole step's loss.

Means over the batch are weighted by the micro-batch's share of the batch, ``reduction="sum"`` losses by 1
(``micro_batch.loss_weights``); with sums, the model's own batch-independent losses (weight regularizers),
which every micro-batch's ``compute_loss`` adds whole, are kept at ``1 / N`` each. A ``LossScaleOptimizer``'s
loss scale is applied per micro-batch and taken off the summed gradients.

A compiled loss whose function returns one value for the whole batch (``tf.reduce_sum(...)`` inside it) is
taken whole by Keras's default reduction: a micro-batch's value is then a sum or a mean over its rows, which
its graph shows only for ``tf.reduce_mean`` (accepted); ``per_row_losses_checked`` refuses the others.
"""

from __future__ import annotations

import contextlib

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


_UNSET = object()
_MEAN_REDUCTIONS = (losses_utils.ReductionV2.AUTO, losses_utils.ReductionV2.SUM_OVER_BATCH_SIZE)


@contextlib.contextmanager
def per_row_losses_checked(model, y_pred, sample_weight):
    """Around a micro-batch's ``compute_loss``: refuses a compiled mean-reduced loss whose ``call`` returns one
    value for the batch (rank 0, or one element) unless that value is a ``tf.reduce_mean`` over its rows
    without sample weights.

    Keras averages per-row losses; a value without rows it takes as it is (the number of its elements is 1), so
    a function returning ``tf.reduce_sum`` of its rows trains on the sum, while micro-batching weighted each
    micro-batch's value by its share of the batch: the step's gradient shrank N times, silently (found by a
    probe). The loss objects' ``call`` is watched on the instance while the block runs (trace time only).

    Raises:
        InterleavingError: such a loss, naming it and the fix.
    """
    compiled = getattr(model, "compiled_loss", None)
    if compiled is not None and not getattr(compiled, "_built", True):
        compiled.build(y_pred)  # as its first call would: the user's functions become Loss objects
    watched = [
        obj
        for obj in tf.nest.flatten(getattr(compiled, "_losses", None))
        if isinstance(obj, tf.keras.losses.Loss) and obj.reduction in _MEAN_REDUCTIONS
    ]
    own = [obj.__dict__.get("call", _UNSET) for obj in watched]
    for obj in watched:
        obj.call = _checked_call(obj, obj.call, sample_weight is not None)
    try:
        yield
    finally:
        for obj, call in zip(watched, own):
            if call is _UNSET:
                del obj.call  # the class's own again
            else:
                obj.call = call


def micro_batch_loss(model, x, y, y_pred, sample_weight):
    """``model.compute_loss`` of a micro-batch, its compiled losses checked (``per_row_losses_checked``)."""
    with per_row_losses_checked(model, y_pred, sample_weight):
        return model.compute_loss(x, y, y_pred, sample_weight)


def _checked_call(obj, call, weighted: bool):
    def checked(y_true, y_pred):
        values = call(y_true, y_pred)
        shape = getattr(values, "shape", None)
        if shape is None or shape.rank is None or (shape.rank > 0 and shape.num_elements() != 1):
            return values  # per-row losses (or unknown): Keras averages them
        source = values
        while source.op.type in ("Identity", "Cast"):
            source = source.op.inputs[0]
        if source.op.type == "Mean" and not weighted:
            return values  # a mean over the micro-batch's rows: weighted by its share, as a per-row loss
        name = getattr(obj, "fn", None) or obj
        name = getattr(name, "__name__", None) or getattr(obj, "name", None) or type(obj).__name__
        raise InterleavingError(
            f"micro-batching: loss {name!r} returns one value for the whole batch (shape {shape}, computed by op "
            f"{source.op.name!r} of type {source.op.type}) under Keras's default reduction, which takes that value "
            "as it is: micro-batching cannot tell whether it is a sum or a mean over the rows"
            + (" (and sample weights then do not scale rows)" if weighted else "")
            + ". Return one loss per row (no reduction inside the function: Keras averages them), or for a sum "
            "compile with reduction='sum' (tf.keras.losses.LossFunctionWrapper(per_row_fn, reduction='sum'), or "
            "a built-in loss's reduction='sum'), or use micro_batches=1."
        )

    return checked


def unscaled_gradients(model, grads: list) -> list:
    """The gradients of ``step_loss``-scaled losses without a ``LossScaleOptimizer``'s loss scale."""
    optimizer = getattr(model, "optimizer", None)
    if not hasattr(optimizer, "get_unscaled_gradients"):
        return grads
    return optimizer.get_unscaled_gradients(grads)

"""The loss each micro-batch of a micro-batched Keras step takes its gradient of (``micro_batch``,
``micro_batch_split``): its share of the whole step's loss.

Means over the batch are weighted by the micro-batch's share of the batch, ``reduction="sum"`` losses by 1
(``micro_batch.loss_weights``); with sums, the model's own batch-independent losses (weight regularizers),
which every micro-batch's ``compute_loss`` adds whole, are kept at ``1 / N`` each. A ``LossScaleOptimizer``'s
loss scale is applied per micro-batch and taken off the summed gradients.

A compiled loss whose function returns one value for the whole batch (``tf.reduce_sum(...)`` inside it) is
taken whole by Keras's default reduction: a micro-batch's value is then a sum or a mean over its rows, which
its graph shows for ``tf.reduce_mean`` and for a sum divided by the rows' count (``mean_over_rows``: accepted);
``per_row_losses_checked`` refuses the others.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from keras.src.utils import losses_utils

from hybridtf._src.errors import InterleavingError
from hybridtf._src.rewrite import batch_statistics


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
        raise InterleavingError(
            "a compiled loss with reduction NONE has no per-step value to micro-batch: compile it with the default "
            "reduction (a mean over the rows) or reduction='sum', or use micro_batches=1."
        )
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
_FIX = (
    "Return one loss per row (no reduction inside the function: Keras averages them); for a sum, compile a "
    "tf.keras.losses.Loss subclass whose call returns per-row losses with reduction='sum' (or a built-in loss's "
    "reduction='sum'); or use micro_batches=1."
)


@contextlib.contextmanager
def per_row_losses_checked(model, y_pred, sample_weight):
    """Around a micro-batch's ``compute_loss``: refuses a compiled mean-reduced loss whose value for the batch
    micro-batching cannot weight.

    Keras averages per-row losses; a value without rows (rank 0, or one element of a micro-batch of more rows)
    it takes as it is, so a function returning ``tf.reduce_sum`` of its rows trains on the sum, while
    micro-batching weighted each micro-batch's value by its share of the batch: the step's gradient shrank N
    times, silently (found by a probe). Accepted: a mean over the micro-batch's rows
    (``batch_statistics.mean_over_rows``: ``tf.reduce_mean``, or a sum over the rows divided by their count)
    without sample weights. A ``Loss`` that overrides ``__call__`` is
    checked on the value it returns, unless its ``call`` was checked on the way. The loss objects are watched
    while the block runs (trace time only): ``call`` on the instance, ``__call__`` through a stand-in in the
    compiled container.

    Raises:
        InterleavingError: such a loss, naming it and the fix.
    """
    compiled = getattr(model, "compiled_loss", None)
    if compiled is not None and not getattr(compiled, "_built", True):
        compiled.build(y_pred)  # as its first call would: the user's functions become Loss objects
    rows = _rows(y_pred)
    losses = getattr(compiled, "_losses", None)
    watched = {  # each once: one Loss object may serve several outputs
        id(obj): obj
        for obj in tf.nest.flatten(losses)
        if isinstance(obj, tf.keras.losses.Loss) and obj.reduction in _MEAN_REDUCTIONS
    }
    watched = list(watched.values())
    weighted = sample_weight is not None
    checked_calls: set[int] = set()
    own = [obj.__dict__.get("call", _UNSET) for obj in watched]
    for obj in watched:
        obj.call = _checked_call(obj, obj.call, weighted, rows, checked_calls)
    overriding = {id(o) for o in watched if type(o).__call__ is not tf.keras.losses.Loss.__call__}
    if overriding:
        compiled._losses = tf.nest.map_structure(
            lambda o: _CheckedLoss(o, weighted, rows, checked_calls) if id(o) in overriding else o, losses
        )
    try:
        yield
    finally:
        if overriding:
            compiled._losses = losses
        for obj, call in zip(watched, own):
            if call is _UNSET:
                del obj.call  # the class's own again
            else:
                obj.call = call


def micro_batch_loss(model, x, y, y_pred, sample_weight):
    """``model.compute_loss`` of a micro-batch, its compiled losses checked (``per_row_losses_checked``) and
    the model's own losses (``add_loss``) too (``_check_model_losses``)."""
    with per_row_losses_checked(model, y_pred, sample_weight):
        loss = model.compute_loss(x, y, y_pred, sample_weight)
    _check_model_losses(model, y_pred)
    return loss


def _rows(y_pred):
    first = next(iter(tf.nest.flatten(y_pred)), None)
    return first.shape[0] if getattr(first, "shape", None) is not None and first.shape.rank else None


def _check_model_losses(model, y_pred) -> None:
    """A term of ``model.losses`` that depends on the micro-batch's data (``add_loss`` over activations) is
    weighted as a mean over its rows: refused unless it is one (``reduce_sum`` of activations was weighted by the
    micro-batch's share, silently; with ``reduction="sum"`` losses each term is kept at 1 / N, right only for
    terms that do not depend on the data). Weight regularizers read variables only: not concerned."""
    if tf.executing_eagerly():
        return
    summed, rows = sums_over_batch(model), _rows(y_pred)
    for term in model.losses:
        if not isinstance(term, tf.Tensor) or not batch_statistics.reaches_inputs(term):
            continue
        if summed or not batch_statistics.mean_over_rows(term, rows):
            raise InterleavingError(
                f"micro-batching: model {model.name!r} adds a loss (add_loss) computed from the batch's data (op "
                f"{term.op.name!r} of type {term.op.type}) that "
                + (
                    "sums with reduction='sum' losses, which keep 1 / N of each model loss per micro-batch"
                    if summed
                    else "is not a tf.reduce_mean over the batch's rows: each micro-batch's value is weighted by its "
                    "share of the batch, right only for a mean"
                )
                + ". Write it as a tf.reduce_mean over the rows (of the default mean-reduced losses), add it to the "
                "compiled loss as a per-row term, or use micro_batches=1."
            )


class _CheckedLoss:
    """Stands in for a compiled ``Loss`` that overrides ``__call__`` while a micro-batch's loss is computed:
    checks the value it returns (``_refuse_unless_mean``) unless its ``call`` was checked meanwhile."""

    def __init__(self, loss, weighted, rows, checked_calls):
        self._loss, self._weighted, self._rows, self._checked_calls = loss, weighted, rows, checked_calls

    def __getattr__(self, name):
        return getattr(self._loss, name)

    def __call__(self, *args, **kwargs):
        self._checked_calls.discard(id(self._loss))
        value = self._loss(*args, **kwargs)
        if id(self._loss) not in self._checked_calls and isinstance(value, tf.Tensor):
            _refuse_unless_mean(self._loss, value, self._weighted, self._rows, "__call__")
        return value


def _checked_call(obj, call, weighted: bool, rows, checked_calls: set):
    def checked(y_true, y_pred):
        values = call(y_true, y_pred)
        checked_calls.add(id(obj))
        shape = getattr(values, "shape", None)
        if shape is None or shape.rank is None:
            return values  # unknown: left as it is
        if shape.rank > 0 and (shape.num_elements() != 1 or rows == 1):
            return values  # per-row losses: Keras averages them
        _refuse_unless_mean(obj, values, weighted, rows, "call")
        return values

    return checked


def _refuse_unless_mean(obj, value, weighted: bool, rows, method: str) -> None:
    if not weighted and batch_statistics.mean_over_rows(value, rows):
        return  # a mean over the micro-batch's rows (keepdims too): weighted by its share, as a per-row loss
    source = value
    while source.op.type in ("Identity", "Cast", "Reshape") and source.op.inputs:
        source = source.op.inputs[0]
    name = getattr(obj, "fn", None) or obj
    name = getattr(name, "__name__", None) or getattr(obj, "name", None) or type(obj).__name__
    raise InterleavingError(
        f"micro-batching: loss {name!r} ({type(obj).__name__}.{method}) returns one value for the whole batch "
        f"(shape {value.shape}, computed by op {source.op.name!r} of type {source.op.type}) under Keras's default "
        "reduction, which takes that value as it is: micro-batching cannot tell whether it is a sum or a mean over "
        "the rows (only a tf.reduce_mean over the rows, or a sum divided by tf.shape(x)[0], shows it)"
        + (" (and sample weights then do not scale rows)" if weighted else "")
        + f". {_FIX}"
    )


def unscaled_gradients(model, grads: list) -> list:
    """The gradients of ``step_loss``-scaled losses without a ``LossScaleOptimizer``'s loss scale."""
    optimizer = getattr(model, "optimizer", None)
    if not hasattr(optimizer, "get_unscaled_gradients"):
        return grads
    return optimizer.get_unscaled_gradients(grads)

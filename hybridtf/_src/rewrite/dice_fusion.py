"""DIN's Dice activation with train-mode batch normalization as one ``HybridTF>Dice`` op (and one gradient op).

DeepCTR's ``Dice`` (and the same lines in a user's own layer) runs a Keras
``BatchNormalization(center=False, scale=False)`` in training mode over the
attention unit's activations ``x`` (``[B, T, units]``) and gates them::

    mean, variance = tf.nn.moments(x, axes=[0, 1])      # Mean; Mean(SquaredDifference(x, StopGradient(mean)))
    inv = tf.math.rsqrt(variance + epsilon)
    normed = x * inv + (-mean * inv)                     # tf.nn.batch_normalization, no offset, no scale
    p = tf.sigmoid(normed)
    y = alpha * (1.0 - p) * x + p * x                    # alpha: [units]

plus the layer's moving-average updates, which read ``mean`` and ``variance``.
Forward and backward that is some thirty element-wise ops and reductions
over ``[B * T, units]``.

Rule (``fused_dice``, tried by ``dataflow_fusion``'s rule for every
``AddV2``): an ``AddV2`` whose operands are ``p * x`` and the product of
``alpha``, ``1 - p`` and ``x`` (any order and association), where ``p`` is the
``Sigmoid`` of exactly the normalization above computed from ``x``'s own batch
statistics over every axis but the last (``Mean`` ops with those axes, through
``Squeeze`` / ``Reshape`` / ``Identity``), becomes one ``Dice`` op
(``hybridtf._src.run.dice``) returning ``y``, the mean and the variance. Every
other consumer of the batch mean or variance (the moving-average updates:
``moving -= (moving - mean) * (1 - momentum)``) is pointed at the fused op's
mean and variance, so Keras's own update ops write the same values into the
same variables, and the original chain is left without consumers (pruned).
The gradient (``DiceGrad``) is the full train-mode gradient, through the batch
statistics.

Matched by dataflow, not by layer class. Inference mode (the moving
statistics instead of ``Mean`` ops), a ``BatchNormalization`` with ``center``
or ``scale``, a ``training`` flag that is a tensor (a ``cond``), or any other
variation keeps its ops as written. The fused values differ from the plain
graph's by float rounding only (the statistics are summed in double, see
``kernels/dice/dice_impl.h``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from hybridtf._src.rewrite.concat_fusion import FLOAT_DTYPES, is_layout_op
from hybridtf._src.run.dice import dice


def _skip_identity(t: tf.Tensor) -> tf.Tensor:
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _layout_chain(t: tf.Tensor) -> list[tf.Tensor]:
    """``t`` and the tensors it is a reshaping of (``Squeeze`` / ``Reshape`` / ``Identity`` ...), ``t`` first."""
    chain = [t]
    while is_layout_op(t.op):
        t = t.op.inputs[0]
        chain.append(t)
    return chain


def _factors(t: tf.Tensor, limit: int) -> list[tf.Tensor] | None:
    """The leaves of the ``Mul`` tree that computes ``t`` (identities skipped), at most ``limit``, or None."""
    t = _skip_identity(t)
    if t.op.type != "Mul":
        return [t]
    leaves = []
    for operand in t.op.inputs:
        sub = _factors(operand, limit)
        if sub is None:
            return None
        leaves.extend(sub)
        if len(leaves) > limit:
            return None
    return leaves


def _take(leaves: list[tf.Tensor], t: tf.Tensor) -> bool:
    """Removes ``t`` from ``leaves`` (by identity); False when it is not there."""
    for i, leaf in enumerate(leaves):
        if leaf is t:
            del leaves[i]
            return True
    return False


def _operands(t: tf.Tensor, op_type: str) -> tuple[tf.Tensor, tf.Tensor] | None:
    """The two inputs (identities skipped) of ``t``'s op when it is a binary ``op_type``, else None."""
    t = _skip_identity(t)
    if t.op.type != op_type or len(t.op.inputs) != 2:
        return None
    return _skip_identity(t.op.inputs[0]), _skip_identity(t.op.inputs[1])


def _has(tensors, t: tf.Tensor) -> bool:
    """``t`` is one of ``tensors`` (by identity: ``==`` on graph tensors would build an ``Equal`` op)."""
    return any(u is t for u in tensors)


def _scalar(t: tf.Tensor) -> float | None:
    """The value of a constant whose elements are all equal, else None."""
    value = tf.get_static_value(t)
    if value is None:
        return None
    value = np.asarray(value).reshape(-1)
    if value.size == 0 or not np.all(value == value[0]):
        return None
    return float(value[0])


def _is_unit_vector(t: tf.Tensor, units: int) -> bool:
    """``t`` holds one value per unit: ``[units]`` or ``[1, ..., 1, units]``."""
    dims = t.shape.as_list() if t.shape.rank is not None else None
    return bool(dims) and dims[-1] == units and all(d == 1 for d in dims[:-1])


def _batch_mean(t: tf.Tensor, x: tf.Tensor) -> tuple[tf.Operation, list[tf.Tensor]] | None:
    """``(Mean op, chain)`` when ``t`` is (a reshaping of) ``reduce_mean(source, every axis but the last)``.

    ``source`` is the Mean's input, checked by the caller; ``chain`` lists ``t`` and the tensors between it and
    the Mean's output (their other consumers get the fused statistic).
    """
    chain = _layout_chain(t)
    mean = chain[-1]
    if mean.op.type != "Mean":
        return None
    axes = tf.get_static_value(mean.op.inputs[1])
    rank = x.shape.rank
    if axes is None or rank is None:
        return None
    axes = sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})
    if axes != list(range(rank - 1)):
        return None
    return mean.op, chain


@dataclasses.dataclass
class DiceMatch:
    """What ``match_dice`` found: the inputs of the fused op and the statistics' tensors to redirect."""

    x: tf.Tensor
    alpha: tf.Tensor
    epsilon: float
    mean_chain: list[tf.Tensor]
    variance_chain: list[tf.Tensor]
    ops: set  # names of the matched ops (their consumers inside the pattern are not redirected)


def _normalized(z: tf.Tensor, x: tf.Tensor, units: int):
    """``(mean tensor, variance tensor, epsilon, op names)`` when ``z = x * inv + (-mean * inv)``, else None."""
    terms = _operands(z, "AddV2")
    if terms is None:
        return None
    for scaled, shift in (terms, terms[::-1]):
        pair = _operands(scaled, "Mul")
        if pair is None or not _has(pair, x) or pair[0] is pair[1]:
            continue
        inv = pair[1] if pair[0] is x else pair[0]
        shift_pair = _operands(shift, "Mul")
        if inv.op.type != "Rsqrt" or shift_pair is None or not _has(shift_pair, inv):
            continue
        neg = shift_pair[1] if shift_pair[0] is inv else shift_pair[0]
        if neg.op.type != "Neg" or not _is_unit_vector(inv, units):
            continue
        plus = _operands(inv.op.inputs[0], "AddV2")
        if plus is None:
            continue
        for variance, eps in (plus, plus[::-1]):
            epsilon = _scalar(eps)
            if epsilon is not None and math.isfinite(epsilon) and epsilon >= 0 and eps.shape.rank == 0:
                ops = {z.op.name, scaled.op.name, shift.op.name, inv.op.name, neg.op.name, plus[0].op.name}
                ops.add(_skip_identity(inv.op.inputs[0]).op.name)
                return neg.op.inputs[0], variance, epsilon, ops
    return None


def match_dice(op: tf.Operation) -> DiceMatch | None:
    """The Dice computation that ``op`` (an ``AddV2``) completes, as the module docstring describes, or None."""
    if op.type != "AddV2" or len(op.inputs) != 2:
        return None
    out = op.outputs[0]
    if out.dtype not in FLOAT_DTYPES or out.shape.rank is None or out.shape.rank < 2 or out.shape[-1] is None:
        return None
    units = int(out.shape[-1])
    a, b = op.inputs
    for gated, direct in ((a, b), (b, a)):
        pair = _factors(direct, 2)
        if pair is None or len(pair) != 2:
            continue
        for p, x in (pair, pair[::-1]):
            if p.op.type != "Sigmoid" or x.dtype != out.dtype or not x.shape.is_compatible_with(out.shape):
                continue
            match = _match_from(gated, p, x, units)
            if match is not None:
                match.ops |= {op.name, _skip_identity(gated).op.name, _skip_identity(direct).op.name}
                return match
    return None


def _match_from(gated: tf.Tensor, p: tf.Tensor, x: tf.Tensor, units: int) -> DiceMatch | None:
    leaves = _factors(gated, 3)
    if leaves is None or len(leaves) != 3 or not _take(leaves, x):
        return None
    one_minus_p = alpha = None
    for i, leaf in enumerate(leaves):
        pair = _operands(leaf, "Sub")
        if pair is not None and pair[1] is p and _scalar(pair[0]) == 1.0 and pair[0].shape.rank == 0:
            one_minus_p, alpha = leaf, leaves[1 - i]
            break
    if one_minus_p is None or alpha.dtype != x.dtype or not _is_unit_vector(alpha, units):
        return None
    x_rank = x.shape.rank
    if x_rank is None or x_rank < 2 or x.shape[-1] != units:
        return None
    norm = _normalized(_skip_identity(p.op.inputs[0]), x, units)
    if norm is None:
        return None
    mean_t, variance_t, epsilon, ops = norm
    mean = _batch_mean(mean_t, x)
    variance = _batch_mean(variance_t, x)
    if mean is None or variance is None or _skip_identity(mean[0].inputs[0]) is not x:
        return None
    deviation = _operands(variance[0].inputs[0], "SquaredDifference")
    if deviation is None:
        return None
    for source, centre in (deviation, deviation[::-1]):
        if source is x and centre.op.type == "StopGradient" and _skip_identity(centre.op.inputs[0]) is mean[1][-1]:
            ops |= {p.op.name, one_minus_p.op.name, centre.op.name}
            ops |= {_skip_identity(variance[0].inputs[0]).op.name}
            ops |= {t.op.name for t in mean[1] + variance[1]}
            return DiceMatch(x, alpha, epsilon, mean[1], variance[1], ops)
    return None


def _redirect(chain: list[tf.Tensor], fused: tf.Tensor, pattern_ops: set) -> None:
    """Points every consumer outside the pattern of a tensor of ``chain`` at ``fused`` (reshaped to it)."""
    for t in chain:
        replacement = None
        for consumer in t.consumers():
            if consumer.name in pattern_ops:
                continue
            if replacement is None:
                replacement = tf.reshape(fused, t.shape) if t.shape.is_fully_defined() else fused
            for i, inp in enumerate(consumer.inputs):
                if inp is t:
                    consumer._update_input(i, replacement)


def fused_dice(op: tf.Operation) -> tf.Tensor | None:
    """One ``Dice`` op for the Dice computation ``op`` (an ``AddV2``) completes; its ``y``, else None.

    The batch mean's and variance's consumers outside the pattern (the moving
    averages) are redirected to the fused op's statistics before returning.

    Example:
        >>> y = fused_dice(add_op)  # inside a traced forward pass (dataflow_fusion)
    """
    match = match_dice(op)
    if match is None:
        return None
    alpha = tf.reshape(match.alpha, [-1]) if match.alpha.shape.rank != 1 else match.alpha
    y, mean, variance = dice(match.x, alpha, match.epsilon)
    _redirect(match.mean_chain, mean, match.ops)
    _redirect(match.variance_chain, variance, match.ops)
    return y

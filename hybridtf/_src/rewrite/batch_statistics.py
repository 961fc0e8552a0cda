"""Statistics over the batch inside a micro-batched step: noticed in the traced graph, warned once.

A micro-batch sees only its own rows, so anything computed over the batch dimension (batch
normalization in training mode, ``tf.nn.moments(x, [0])`` in a hand-written normalization, batch-wise
softmax) differs from the whole step. hybridtf refuses the Keras layers it can name
(``micro_batch.check_layers``); this scan finds the ops such code leaves in the first micro-batch's
graph: a fused batch normalization in training mode (not the per-row one of Keras's
``LayerNormalization``), a ``tf.nn.moments`` mean over axis 0, and a hand-written one: a reduction
(``tf.reduce_mean``, ``reduce_sum``, ``reduce_max``, ...) over axis 0 of the step's data whose result
(through element-wise math) is combined with the rows again, as ``x - tf.reduce_mean(x, 0)`` or
``x / tf.reduce_sum(x, 0)`` is (a mean that only reaches the loss is the loss's own); and math that
combines rows with each other: a matrix product of two tensors of the data (in-batch negatives, ``u @
tf.transpose(v)``; per-example products are batched matmuls), such an einsum, a softmax over the batch.
Other batch-dependent math stays the caller's to avoid (documented).
"""

from __future__ import annotations

import contextlib
import logging
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops

_log = logging.getLogger("hybridtf")
_FUSED_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_told: set[tuple[str, tuple[str, ...]]] = set()


_REDUCTIONS = frozenset(("Mean", "Sum", "Max", "Min", "Prod"))


ANY_ROWS = object()  # a micro-batch's number of rows not given: any first dimension may be the rows


def rows_of(structure):
    """The static number of rows (first dimension: an int, or None when unknown) of the first tensor in
    ``structure`` (a micro-batch's inputs or features), or ``ANY_ROWS`` when it holds none."""
    for t in tf.nest.flatten(structure, expand_composites=False):
        if isinstance(t, (tf.Tensor, tf.RaggedTensor)) and t.shape.rank:
            return t.shape[0]
    return ANY_ROWS


def batch_statistics_ops(operations, rows=ANY_ROWS) -> list[str]:
    """The names of ``operations`` that compute statistics over the batch (first) dimension, or combine the
    batch's rows with each other (a product of two tensors of the data, a softmax over the batch).

    ``rows``: the micro-batch's static number of rows (None: unknown), if known; a reduction, product or softmax
    is then followed only over tensors with that first dimension (a ``tf.stack`` of fields on axis 0, whose
    first dimension is the static number of fields, is not the batch's).
    """

    def on_rows(t) -> bool:
        return bool(t.shape.rank) and (rows is ANY_ROWS or t.shape[0] == rows) and reaches_inputs(t)

    found = []
    for op in operations:
        if op.type in _FUSED_BATCH_NORMS:
            # Keras's LayerNormalization runs one on its input reshaped to [1, rows, ..., 1] (NCHW): statistics per
            # row, its first dimension statically 1; a batch's first dimension is not (a micro-batch's unknown)
            shape = op.inputs[0].shape
            if op.get_attr("is_training") and not (shape.rank and shape[0] == 1):
                found.append(op.name)
        elif op.type in _REDUCTIONS and _averages_first_axis(op) and on_rows(op.inputs[0]):  # not a weight's
            moments = op.type == "Mean" and op.name.split("/")[-2:-1] == ["moments"]
            if moments or _meets_rows_again(op.outputs[0], on_rows):
                found.append(op.name)
        elif _mixes_rows(op, on_rows):
            found.append(op.name)
    return found


def _mixes_rows(op, on_rows) -> bool:
    """Whether ``op`` combines different rows of the step's data: a matrix product of two tensors of the data
    (in-batch negatives ``u @ tf.transpose(v)``, a Gram matrix ``tf.transpose(x) @ x``: per-example products
    of [rows, ...] tensors are batched matmuls or einsums that keep the rows' label), an einsum of two such
    tensors whose first labels differ or leave the output (``"bd,cd->bc"``), or a softmax over the rows
    (``tf.nn.softmax(x, axis=0)``: a transpose that moves axis 0 last, or a vector of the data)."""
    if op.type == "MatMul":
        return all(on_rows(t) for t in op.inputs)
    if op.type == "Einsum" and len(op.inputs) == 2:
        equation = op.get_attr("equation")
        equation = equation.decode() if isinstance(equation, bytes) else equation
        inputs, _, output = equation.replace(" ", "").partition("->")
        labels = inputs.split(",")
        if len(labels) != 2 or not all(labels) or any(x.startswith(".") for x in labels) or not output:
            return False
        first = {x[0] for x in labels}
        mixing = len(first) > 1 or not first <= set(output)
        return mixing and all(on_rows(t) for t in op.inputs)
    if op.type in ("Softmax", "LogSoftmax"):
        logits = op.inputs[0]
        while logits.op.type == "Identity":
            logits = logits.op.inputs[0]
        if logits.shape.rank == 1:
            return on_rows(logits)
        if logits.op.type == "Transpose":
            perm = _folded(logits.op.inputs[1])
            return (
                perm is not None and np.size(perm) > 1 and int(np.ravel(perm)[-1]) == 0 and on_rows(logits.op.inputs[0])
            )
    return False


def _folded(tensor, depth: int = 6):
    """``tensor``'s value when its ops fold to a constant: ``tf.get_static_value``, and the ``Rank`` / ``Range`` /
    ``ConcatV2`` / ``Pack`` / ``Sub`` / ``AddV2`` ops over such values that ``tf.nn.softmax(x, axis)`` builds the
    permutation of its transpose with (which ``tf.get_static_value`` does not fold); None otherwise."""
    value = tf.get_static_value(tensor)
    if value is not None or depth == 0:
        return value
    op = tensor.op
    if op.type == "Rank":
        rank = op.inputs[0].shape.rank
        return None if rank is None else np.int32(rank)
    parts = [_folded(t, depth - 1) for t in op.inputs]
    if any(p is None for p in parts):
        return None
    if op.type == "Range" and len(parts) == 3:  # a permutation's: as long as a rank
        start, limit, delta = (int(np.reshape(p, ())) for p in parts)
        return np.arange(start, limit, delta) if delta and len(range(start, limit, delta)) <= 64 else None
    if op.type == "ConcatV2":
        return np.concatenate([np.ravel(p) for p in parts[:-1]])
    if op.type == "Pack":
        return np.stack(parts)
    if op.type in ("Sub", "AddV2"):
        return parts[0] - parts[1] if op.type == "Sub" else parts[0] + parts[1]
    return None


# element-wise ops through which a statistic is followed; one whose other operand holds rows of the data joins it
# with the rows (x - mean, x / std, x * scale)
_ELEMENTWISE = frozenset(
    "Identity Cast Neg Square Sqrt Rsqrt Reciprocal Abs Exp Log StopGradient Reshape ExpandDims Squeeze AddV2 Add Sub "
    "Mul RealDiv DivNoNan SquaredDifference Maximum Minimum Pow BiasAdd".split()
)


def _meets_rows_again(statistic, on_rows, depth: int = 8) -> bool:
    """Whether ``statistic`` (a mean over the batch, traced) is combined, through element-wise ops, with a tensor
    of several rows of the step's data: a hand-written normalization ``(x - mean) / std``. A loss's mean (summed,
    scaled, returned) never is."""
    frontier, seen = [statistic], set()
    for _ in range(depth):
        following = []
        for tensor in frontier:
            for consumer in tensor.consumers():
                if consumer.type not in _ELEMENTWISE or consumer in seen:
                    continue
                seen.add(consumer)
                others = [t for t in consumer.inputs if t is not tensor]
                if any(on_rows(t) and t.shape[0] != 1 for t in others):
                    return True
                following.extend(consumer.outputs)
        frontier = following
    return False


@contextlib.contextmanager
def noted(where: str, enabled: bool = True, rows=ANY_ROWS):
    """Warns once per (``where``, ops) when the block (a micro-batch's forward pass and loss, traced) creates
    ops that compute statistics over the batch; nothing eagerly (no graph to read) or unless ``enabled``.
    ``rows``: the micro-batch's static number of rows (``rows_of`` its inputs), when known."""
    if not enabled or tf.executing_eagerly():
        yield
        return
    graph = ops.get_default_graph()
    start = len(graph.get_operations())
    yield
    found = tuple(batch_statistics_ops(graph.get_operations()[start:], rows))
    if found and (where, found) not in _told:
        _told.add((where, found))
        _log.warning(
            "hybridtf: %s computes statistics over the batch in each micro-batch (ops %s: a batch normalization in "
            "training mode, tf.nn.moments over axis 0, a reduction over axis 0 applied to the rows again, a softmax "
            "over the batch, or a matmul of two tensors of the data such as in-batch negatives u @ tf.transpose(v)): "
            "a micro-batch combines only its own rows, so the step differs from the whole batch's. Call such layers "
            "with training=False (moving statistics), compute the statistics before the micro-batched part "
            "(interleave_from after them), or use micro_batches=1.",
            where,
            ", ".join(found[:5]) + (", ..." if len(found) > 5 else ""),
        )


_DATA_OPS = ("IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue")


def reaches_inputs(tensor, limit: int = 20_000) -> bool:
    """Whether ``tensor`` (traced) depends on the step's data: its graph's non-resource placeholders (a
    function's arguments) or an iterator's elements, following op inputs back and stopping at variable reads
    and constants. Past ``limit`` ops it answers True (cannot tell: assumed to)."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if len(seen) > limit or op.type in _DATA_OPS:
            return True
        if op.type in ("ReadVariableOp", "Const", "VarHandleOp"):
            continue
        if op.type == "Placeholder":
            if op.outputs[0].dtype != tf.resource:
                return True
            continue
        stack.extend(t.op for t in op.inputs)
    return False


def _scaled_source(value, keep=lambda op: False):
    """``value`` without casts, identities and scaling by a scalar that does not depend on the data; stops at an
    op for which ``keep`` is true."""
    while True:
        op = value.op
        if keep(op):
            return value
        if op.type in ("Identity", "Cast", "Neg"):
            value = op.inputs[0]
        elif op.type in ("Mul", "RealDiv", "DivNoNan") and len(op.inputs) == 2:
            a, b = op.inputs
            scalar = [t.shape.rank == 0 and not reaches_inputs(t) for t in (a, b)]
            if scalar[1]:
                value = a
            elif scalar[0] and op.type == "Mul":
                value = b
            else:
                return value
        else:
            return value


def mean_over_rows(value, rows) -> bool:
    """Whether scalar ``value`` (traced) is a mean over the rows of a tensor of the step's data whose first
    dimension is ``rows`` (the micro-batch's static size, or None), up to casts and scaling by a data-independent
    scalar: a ``tf.reduce_mean`` over axes including the first, or a ``tf.reduce_sum`` over them divided by the
    tensor's number of rows (``tf.shape(x)[0]``, ``tf.nn.compute_average_loss``) or, summed over every axis, by
    its size (``tf.size(x)``). ``tf.reduce_mean(tf.reduce_sum(x))`` is not (a sum), nor a sum divided by a
    number written in the code (the whole batch's size: each micro-batch's value is then a share of a sum)."""
    source = _scaled_source(value, keep=lambda op: _sum_over_rows(op, rows))
    if source.op.type == "Mean":
        data = source.op.inputs[0]
        return _averages_first_axis(source.op) and data.shape[0] == rows and reaches_inputs(data)
    return _sum_over_rows(source.op, rows)


def _sum_over_rows(op, rows) -> bool:
    """Whether ``op`` divides a sum over the first axis of the step's data (``rows`` rows) by its number of rows
    (``_counts_rows``); checked before a division by a constant is taken for scaling (a static shape is one)."""
    if op.type not in ("RealDiv", "DivNoNan"):
        return False
    total, count = op.inputs
    total = _scaled_source(total)
    if total.op.type != "Sum":
        return False
    data = total.op.inputs[0]
    if not (_averages_first_axis(total.op) and data.shape[0] == rows and reaches_inputs(data)):
        return False
    return _counts_rows(count, data, rows, every_axis=_reduces_every_axis(total.op))


_SHAPE_NAME = re.compile(r"^Shape(_\d+)?$")
_SIZE_NAME = re.compile(r"^Size(_\d+)?$")


def _counts_rows(count, data, rows, every_axis: bool) -> bool:
    """Whether ``count`` is the number of rows of ``data`` (a micro-batch's tensor of ``rows`` rows): the first
    element of its shape (``tf.shape(t)[0]`` of ``data`` or another tensor of the step's data with as many rows;
    a static shape TensorFlow wrote as a constant named ``Shape``), times 1 (``compute_average_loss``'s replica
    count), cast; with ``every_axis``, ``tf.size(data)``."""
    while True:
        op = count.op
        if op.type in ("Cast", "Identity"):
            count = op.inputs[0]
        elif op.type == "Mul" and len(op.inputs) == 2 and any(_static_equals(t, 1) for t in op.inputs):
            count = op.inputs[1] if _static_equals(op.inputs[0], 1) else op.inputs[0]
        else:
            break
    op = count.op
    if op.type == "StridedSlice" and _first_element(op):
        shape = op.inputs[0]
        if shape.op.type == "Shape":
            shaped = shape.op.inputs[0]
            return shaped is data or (
                bool(shaped.shape.rank) and shaped.shape[0] == data.shape[0] and reaches_inputs(shaped)
            )
        if shape.op.type == "Const" and _SHAPE_NAME.match(shape.op.name.rsplit("/", 1)[-1]):
            value = tf.get_static_value(shape)
            return rows is not None and value is not None and np.ndim(value) == 1 and int(value[0]) == rows
        return False
    if not every_axis:
        return False
    if op.type == "Size":
        return op.inputs[0] is data
    if op.type == "Const" and _SIZE_NAME.match(op.name.rsplit("/", 1)[-1]):
        return data.shape.is_fully_defined() and _static_equals(count, data.shape.num_elements())
    return False


def _static_equals(tensor, number) -> bool:
    value = tf.get_static_value(tensor)
    return value is not None and np.size(value) == 1 and float(np.reshape(value, ())) == float(number)


def _first_element(strided_slice) -> bool:
    """Whether a ``StridedSlice`` op takes element 0 of a vector as a scalar (``v[0]``)."""
    begin, end, strides = (tf.get_static_value(t) for t in strided_slice.inputs[1:4])
    if begin is None or end is None or strides is None:
        return False
    return (
        list(begin) == [0]
        and list(end) == [1]
        and list(strides) == [1]
        and strided_slice.get_attr("shrink_axis_mask") == 1
        and not strided_slice.get_attr("begin_mask")
        and not strided_slice.get_attr("end_mask")
    )


def _reduces_every_axis(reduction) -> bool:
    """Whether a reduction op (``Sum``) reduces every axis of its input (static axes and rank)."""
    rank = reduction.inputs[0].shape.rank
    axes = tf.get_static_value(reduction.inputs[1])
    if rank is None or axes is None:
        return False
    return {int(a) % rank for a in np.ravel(axes)} == set(range(rank)) if rank else True


def _averages_first_axis(mean) -> bool:
    """Whether reduction op ``mean`` (``Mean``, ``Sum``, ...) reduces its input's first axis (static axes, known
    rank >= 1)."""
    rank = mean.inputs[0].shape.rank
    axes = tf.get_static_value(mean.inputs[1])
    return bool(rank) and axes is not None and any(int(a) % rank == 0 for a in tf.nest.flatten(axes.tolist()))

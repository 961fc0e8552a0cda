"""Python wrapper and gradient of the fused ``HybridTF>StitchConcat`` op."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.run import gradient_arrivals
from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.second_order import FUSION_FIX, refuse_second_order

OP_NAME = "HybridTF>StitchConcat"
GRAD_OP_NAME = "HybridTF>StitchConcatGrad"
MATMUL_OP_NAME = "HybridTF>StitchConcatMatMul"
MATMUL_GRAD_OP_NAME = "HybridTF>StitchConcatMatMulGrad"

refuse_second_order(GRAD_OP_NAME, FUSION_FIX)  # no second-order gradient: refused by name
refuse_second_order(MATMUL_GRAD_OP_NAME, FUSION_FIX)


@dataclasses.dataclass(frozen=True)
class StitchGroup:
    """One packed table's chain as StitchCombine takes it (see ``stitch_combine``).

    Attributes:
        rows: ``[num_unique, dim]`` gathered rows of the distinct ids.
        inverse: ``[n]`` position -> row index.
        field_sizes: ``[num_fields]`` int64 positions per field.
        field_segments: ``[num_fields]`` int64 output rows per field.
        segment_lengths: int64 lengths of the bags of the bag fields.
        combiners: one of ``"none" | "sum" | "mean" | "sqrtn"`` per field.
    """

    rows: tf.Tensor
    inverse: tf.Tensor
    field_sizes: tf.Tensor
    field_segments: tf.Tensor
    segment_lengths: tf.Tensor
    combiners: tuple[str, ...]


def _static_width(t: tf.Tensor, what: str) -> int:
    if t.shape.rank != 2 or t.shape[1] is None:
        raise ValueError(f"stitch_concat: {what} must be a matrix with a static width, got shape {t.shape}.")
    return int(t.shape[1])


def stitch_concat(
    groups: Sequence[StitchGroup],
    dense: Sequence[tf.Tensor],
    pieces: Sequence[tuple[int, int]],
    name: str | None = None,
) -> tf.Tensor:
    """Concatenates fields of several packed tables and dense matrices along columns, in one op.

    Equal to ``tf.concat([piece_0, piece_1, ...], axis=-1)`` where piece
    ``(g, f)`` with ``g >= 0`` is field ``f``'s StitchCombine output of group
    ``g`` and ``(-1, m)`` is ``dense[m]`` — but the fields are stitched (and
    combined) straight into their columns, so neither the per-field outputs nor
    the concatenation (nor, backward, its split) exist. The gradient is one op
    that sums each distinct row's gradient from its columns row by row; when
    each row is reached by one field only (one field per table, the usual
    case) that is StitchCombine's gradient order, bit for bit.

    Args:
        groups: the chains whose fields are placed (at least one).
        dense: other ``[batch, width]`` matrices to place, each exactly once.
        pieces: the columns in order: ``(group index, field index)`` or ``(-1, dense index)``.
        name: optional name scope.

    Returns:
        ``[batch, sum of piece widths]``.

    Raises:
        ValueError: no groups, widths not static, or pieces that do not fit the groups.
        tf.errors.InvalidArgumentError: pieces with different numbers of rows.

    Example:
        >>> g = StitchGroup(rows, inverse, sizes, sizes, tf.zeros([0], tf.int64), ("none", "none"))
        >>> stitch_concat([g], [dense], [(0, 1), (-1, 0), (0, 0)])  # == concat([field 1, dense, field 0])
    """
    with tf.name_scope(name or "stitch_concat"):
        args, attrs = _layout_args(groups, dense, pieces)
        return load_ops().hybrid_tf_stitch_concat(*args, **attrs)


def _layout_args(groups: Sequence[StitchGroup], dense: Sequence[tf.Tensor], pieces: Sequence[tuple[int, int]]):
    """The op inputs and attributes shared by StitchConcat and StitchConcatMatMul."""
    if not groups:
        raise ValueError("stitch_concat needs at least one group.")
    for i, g in enumerate(groups):
        _static_width(g.rows, f"rows of group {i}")
    for m, d in enumerate(dense):
        _static_width(d, f"dense input {m}")
    index_dtype = tf.int64 if len({g.inverse.dtype for g in groups}) > 1 else groups[0].inverse.dtype
    args = (
        [g.rows for g in groups],
        [tf.cast(g.inverse, index_dtype) for g in groups],
        [g.field_sizes for g in groups],
        [g.field_segments for g in groups],
        [g.segment_lengths for g in groups],
        list(dense),
    )
    attrs = dict(
        group_fields=[len(g.combiners) for g in groups],
        combiners=[c for g in groups for c in g.combiners],
        piece_groups=[int(p[0]) for p in pieces],
        piece_items=[int(p[1]) for p in pieces],
    )
    return args, attrs


def _op_layout(op: tf.Operation):
    """A StitchConcat(-MatMul) op's six input lists (rows, inverses, sizes, segments, lengths, dense) and attrs."""
    ng, nd = op.get_attr("num_groups"), op.get_attr("num_dense")
    inputs = list(op.inputs)
    lists = (*(inputs[i * ng : (i + 1) * ng] for i in range(5)), inputs[5 * ng : 5 * ng + nd])
    attrs = {a: op.get_attr(a) for a in ("group_fields", "combiners", "piece_groups", "piece_items")}
    return lists, attrs


def note_placed_fields(rows: Sequence[tf.Tensor], attrs: dict) -> None:
    """In a gradient function: every field the op places got the op's (real) output gradient."""
    placed: dict[int, list[int]] = {}
    for g, item in zip(attrs["piece_groups"], attrs["piece_items"]):
        if g >= 0:
            placed.setdefault(g, []).append(item)
    for g, fields in placed.items():
        gradient_arrivals.note_fields(rows[g], fields)


def stitch_concat_matmul(
    groups: Sequence[StitchGroup],
    dense: Sequence[tf.Tensor],
    pieces: Sequence[tuple[int, int]],
    kernel: tf.Tensor,
    name: str | None = None,
) -> tf.Tensor:
    """``stitch_concat(groups, dense, pieces) @ kernel`` without the concatenated matrix.

    Every field's block of the product is computed through the distinct rows its
    positions read: a distinct row is multiplied by the kernel's block once, however
    often the batch repeats it (with Zipf ids a field reads far fewer distinct rows
    than the batch has rows). Backward, each distinct row's gradient comes out
    summed, and the kernel's gradient is ``sum_u rows[u]^T (summed output gradient
    of u)``. Equal to ``tf.matmul(stitch_concat(...), kernel)`` up to float
    rounding (the sums run in another order); the results do not depend on the
    number of threads.

    Args:
        groups: as for ``stitch_concat``.
        dense: as for ``stitch_concat``.
        pieces: as for ``stitch_concat``.
        kernel: ``[width, units]``, width being the concatenation's.
        name: optional name scope.

    Returns:
        ``[batch, units]``.

    Raises:
        ValueError: as ``stitch_concat``.
        tf.errors.InvalidArgumentError: the kernel's rows do not match the concatenated width.

    Example:
        >>> stitch_concat_matmul([g], [dense], [(0, 0), (-1, 0)], dense_layer.kernel)
    """
    with tf.name_scope(name or "stitch_concat_matmul"):
        args, attrs = _layout_args(groups, dense, pieces)
        return load_ops().hybrid_tf_stitch_concat_mat_mul(*args, kernel, **attrs)


@tf.RegisterGradient(MATMUL_OP_NAME)
def _stitch_concat_matmul_grad(op, grad):
    lists, attrs = _op_layout(op)
    note_placed_fields(lists[0], attrs)
    kernel = op.inputs[-1]
    d_rows, d_dense, d_kernel = load_ops().hybrid_tf_stitch_concat_mat_mul_grad(grad, kernel, *lists, **attrs)
    return [*d_rows, *([None] * (4 * len(lists[0]))), *d_dense, d_kernel]


def _column_broadcast_source(grad: tf.Tensor) -> tf.Tensor | None:
    """``[batch, 1]`` values whose broadcast over the columns is ``grad``, or None.

    The gradient of ``tf.reduce_sum(concat, axis=-1, keepdims=True)`` (the usual
    linear / first-order part of a CTR model) is its output gradient tiled over
    the concatenation's columns: ``Tile([B, 1], [1, W])`` when the batch size is
    static, ``BroadcastTo([B, 1], shape)`` otherwise. A sum over a concatenation
    seen as ``[B, n, k]`` (a stack, DeepCTR's ``[B, 1, n]`` linear logits, a sum
    without ``keepdims``) broadcasts a ``[B, 1, 1]`` gradient and reshapes it to
    ``[B, W]``: the same values per row. StitchConcatGrad then reads the
    ``[B, 1]`` column instead of the ``[B, W]`` matrix (which TensorFlow no
    longer computes): the same values, summed in the same order.
    """
    if not isinstance(grad, tf.Tensor) or grad.shape.rank != 2 or tf.executing_eagerly():
        return None
    spread = grad
    if grad.op.type == "Reshape":  # [B, n, k] broadcast, read as [B, W]: rows match when n * k == W
        spread = grad.op.inputs[0]
        dims = spread.shape.as_list() if spread.shape.rank is not None else None
        if not dims or len(dims) < 2 or any(d is None for d in dims[1:]) or grad.shape[1] is None:
            return None
        if math.prod(dims[1:]) != grad.shape[1]:
            return None
    op = spread.op
    if op.type not in ("Tile", "BroadcastTo"):
        return None
    src = op.inputs[0]
    rank = spread.shape.rank
    if src.shape.rank != rank or any(d != 1 for d in src.shape.as_list()[1:]) or src.dtype != grad.dtype:
        return None
    if op.type == "Tile":
        multiples = tf.get_static_value(op.inputs[1])
        if multiples is None or len(multiples) != rank:
            return None
        # [B, 1, ...] tiled once over the rows (an empty batch gives multiples [0, W] for [0, 1])
        if int(multiples[0]) == 1 or (int(multiples[0]) == 0 and src.shape[0] == 0):
            return src if rank == 2 else tf.reshape(src, [-1, 1])
        return None
    target = op.inputs[1]  # BroadcastTo: src may also be [1, 1, ...]; give it the batch of the target shape
    if target.shape.rank != 1 or target.shape[0] != rank:
        return None
    column = src if rank == 2 else tf.reshape(src, tf.stack([tf.shape(src, out_type=target.dtype)[0], 1]))
    return tf.broadcast_to(column, tf.concat([target[:1], tf.ones([1], target.dtype)], 0))


@tf.RegisterGradient(OP_NAME)
def _stitch_concat_grad(op, grad):
    (rows, inverses, sizes, segments, lengths, dense), attrs = _op_layout(op)
    note_placed_fields(rows, attrs)
    column = _column_broadcast_source(grad)
    if column is not None:
        grad, attrs = column, {**attrs, "broadcast_grad": True}
    d_rows, d_dense = load_ops().hybrid_tf_stitch_concat_grad(
        grad,
        inverses,
        sizes,
        segments,
        lengths,
        [tf.shape(r, out_type=tf.int64)[0] for r in rows],
        dims=[_static_width(r, "rows") for r in rows],
        dense_widths=[_static_width(d, "dense") for d in dense],
        num_dense=len(dense),
        **attrs,
    )
    return [*d_rows, *([None] * (4 * len(rows))), *d_dense]


def matmul_of_stitch_concat(concat: tf.Operation, kernel) -> tf.Tensor:
    """``StitchConcat op's output @ kernel`` as one StitchConcatMatMul on the same inputs.

    Example:
        >>> matmul_of_stitch_concat(x.op, dense_layer.kernel)  # x: a StitchConcat output
    """
    if concat.type != OP_NAME:
        raise ValueError(f"matmul_of_stitch_concat needs a {OP_NAME} op, got {concat.type}.")
    lists, attrs = _op_layout(concat)
    return load_ops().hybrid_tf_stitch_concat_mat_mul(*lists, kernel, **attrs)

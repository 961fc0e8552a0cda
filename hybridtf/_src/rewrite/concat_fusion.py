"""Column layouts of packed lookups' outputs: what one StitchConcat computes.

CTR models join their fields' embeddings (and the dense features) before the
MLP, and sum their dim-1 (wide) embeddings. With hundreds of fields the
concatenation and, backward, its split copy every embedding a second time in
hundreds of narrow pieces. ``StitchConcat`` stitches the fields straight from
the gathered rows into their columns instead.

This module holds the pure part of that rewrite, on graph tensors:

* ``field_source``: which StitchCombine field a tensor holds (seen through
  shape-only ops: a ``[B, 1, d]`` lookup flattened or reshaped is the same
  field's rows in the same order);
* ``column_view``: how a piece of a concatenation (or stack) along some axis
  reads as a ``[rows, width]`` matrix, so that the concatenation is a
  column concatenation of those matrices reshaped to the output's shape;
* ``ColumnLayout``: collects pieces (fields of any number of packed tables,
  fields of another StitchConcat, dense tensors) and builds the one
  StitchConcat;
* ``stitch_concat_source`` and ``fused_matmul``: a matrix product whose left
  operand is a StitchConcat output becomes one StitchConcatMatMul.

Which ops are rewritten, and when, is decided by ``dataflow_fusion`` (the
ops a model's forward pass creates, whatever layer or function created them).
"""

from __future__ import annotations

import math

import tensorflow as tf

from hybridtf._src.run.stitch_combine import OP_NAME as STITCH_COMBINE
from hybridtf._src.run.stitch_concat import OP_NAME as STITCH_CONCAT
from hybridtf._src.run.stitch_concat import StitchGroup, matmul_of_stitch_concat, stitch_concat

# Ops that only change a tensor's shape, never the row-major order of its values.
LAYOUT_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze"})
FLOAT_DTYPES = (tf.float32, tf.float64)


def _whole_slice(op) -> bool:
    """A ``StridedSlice`` that keeps every value in order: ``x[:, 0, :]`` of a ``[B, 1, d]`` ``x`` (the index
    only drops an axis of size 1). Unit strides, the batch axis whole, and as many values per example out as in."""
    if op.type != "StridedSlice" or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        return False
    if not op.get_attr("begin_mask") & 1 or not op.get_attr("end_mask") & 1 or op.get_attr("shrink_axis_mask") & 1:
        return False
    strides = tf.get_static_value(op.inputs[3])
    if strides is None or any(int(s) != 1 for s in strides):
        return False
    x, y = op.inputs[0].shape, op.outputs[0].shape
    if x.rank is None or y.rank is None or x.rank < 2 or y.rank < 1:
        return False
    inner_x, inner_y = x.as_list()[1:], y.as_list()[1:]
    if None in inner_x or None in inner_y:
        return False
    return math.prod(inner_x) == math.prod(inner_y)


def is_layout_op(op) -> bool:
    """Whether ``op`` only changes its first input's shape, never the row-major order of its values."""
    return bool(op.inputs) and (op.type in LAYOUT_OPS or _whole_slice(op))


def _through_layout(t: tf.Tensor) -> tf.Tensor:
    while is_layout_op(t.op):
        t = t.op.inputs[0]
    return t


def field_source(t: tf.Tensor):
    """``(StitchCombine op, field index, dim)`` when ``t`` holds one unweighted field's rows, else None.

    Shape-only ops in between are seen through: a field looked up with ids of
    shape ``[B, 1]`` gives ``[B, 1, d]``, whose ``Flatten`` or ``Reshape`` holds
    the same values in the same order as the StitchCombine output ``[B, d]``.
    The caller checks that the shapes agree (``column_view``). A StitchCombine
    output in its ids' shape (``id_shapes``: ``[B, 1, d]`` for ids ``[B, 1]``)
    is one row of ``d`` per example when its middle dimensions are all 1.
    """
    src = _through_layout(t)
    op = src.op
    if op.type != STITCH_COMBINE or src.shape.rank is None or src.shape.rank < 2 or src.shape[-1] is None:
        return None
    if any(d != 1 for d in src.shape.as_list()[1:-1]):
        return None
    weights = op.inputs[5]
    if weights.shape.rank != 1 or weights.shape[0] != 0:
        return None
    return op, src.value_index, int(src.shape[-1])


def stitch_concat_source(t: tf.Tensor, width: int | None):
    """The StitchConcat op whose ``[B, width]`` output ``t`` holds (through shape-only ops), else None."""
    src = _through_layout(t)
    if src.op.type != STITCH_CONCAT or src.shape.rank != 2 or width is None or src.shape[1] != width:
        return None
    return src.op


def column_view(t: tf.Tensor, axis: int) -> int | None:
    """Width of ``t`` read as a ``[t.shape[0], width]`` matrix for a concatenation along ``axis``, or None.

    Concatenating rank-r tensors along ``axis`` (1 <= axis) is a column
    concatenation of their ``[rows, prod(shape[axis:])]`` views when the axes
    between the batch and ``axis`` are all 1 (statically): then every piece has
    the same rows as the batch. ``tf.stack`` along ``axis`` reads the same way.
    """
    shape = t.shape
    if shape.rank is None or not 1 <= axis <= shape.rank:
        return None
    dims = shape.as_list()
    if any(d != 1 for d in dims[1:axis]) or any(d is None for d in dims[axis:]):
        return None
    return math.prod(dims[axis:])


def _group_key(tensors) -> tuple:
    return tuple(t.ref() for t in tensors)


class ColumnLayout:
    """The pieces of one StitchConcat ``[B, sum of widths]``, in column order.

    Example:
        >>> layout = ColumnLayout()
        >>> layout.add(field_a, 8); layout.add(dense, 3); layout.add(field_b, 8)
        >>> layout.num_fields, layout.build(batch=None).shape
        (2, TensorShape([None, 19]))
    """

    def __init__(self):
        self._group_index: dict = {}
        self._groups: list[StitchGroup] = []
        self._dense: list[tf.Tensor] = []
        self._pieces: list[tuple[int, object]] = []  # (group, field) or (-1, (tensor, width))
        self._placed: set = set()
        self.num_fields = 0
        self.width = 0

    def _group(self, inputs, combiners) -> int:
        key = _group_key(inputs)
        if key not in self._group_index:
            self._group_index[key] = len(self._groups)
            self._groups.append(StitchGroup(*inputs, combiners=tuple(combiners)))
        return self._group_index[key]

    def _place_field(self, inputs, combiners, field: int) -> None:
        g = self._group(inputs, combiners)
        self._placed.add((g, field))
        self._pieces.append((g, field))
        self.num_fields += 1

    def add(self, t: tf.Tensor, width: int) -> None:
        """Appends ``t`` (read as ``[B, width]``): a field, the fields of a StitchConcat, or a dense piece."""
        self.width += width
        src = field_source(t)
        if src is not None and src[2] == width:
            op, field, _ = src
            combiners = [c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners")]
            key = _group_key(op.inputs[:5])
            if (self._group_index.get(key), field) not in self._placed:
                self._place_field(op.inputs[:5], combiners, field)
                return
        inner = stitch_concat_source(t, width)
        if inner is not None and self._absorb(inner):
            return
        self._pieces.append((-1, (t, width)))

    def _absorb(self, op: tf.Operation) -> bool:
        """Places the pieces of another StitchConcat here (False if one of its fields is placed already)."""
        ng, nd = op.get_attr("num_groups"), op.get_attr("num_dense")
        inputs = list(op.inputs)
        group_inputs = [[inputs[k * ng + g] for k in range(5)] for g in range(ng)]
        group_fields = list(op.get_attr("group_fields"))
        combiners = [c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners")]
        starts = [sum(group_fields[:g]) for g in range(ng)]
        dense = inputs[5 * ng : 5 * ng + nd]
        pieces = list(zip(op.get_attr("piece_groups"), op.get_attr("piece_items")))
        for g, item in pieces:
            if g >= 0 and (self._group_index.get(_group_key(group_inputs[g])), item) in self._placed:
                return False
        for g, item in pieces:
            if g >= 0:
                fields = combiners[starts[g] : starts[g] + group_fields[g]]
                self._place_field(group_inputs[g], fields, item)
            else:
                d = dense[item]
                self._pieces.append((-1, (d, int(d.shape[1]))))
        return True

    def build(self, batch: int | None) -> tf.Tensor:
        """Creates the StitchConcat (and the reshapes of dense pieces to matrices); returns ``[B, width]``."""
        pieces = []
        for g, item in self._pieces:
            if g >= 0:
                pieces.append((g, item))
                continue
            t, width = item
            if t.shape.rank != 2:
                t = tf.reshape(t, [-1, width])
            pieces.append((-1, len(self._dense)))
            self._dense.append(t)
        out = stitch_concat(self._groups, self._dense, pieces)
        out.set_shape([batch, self.width])
        return out


def fused_matmul(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor | None:
    """``x @ kernel`` as one StitchConcatMatMul when ``x`` is a StitchConcat output, else None.

    Example:
        >>> fused_matmul(concat_output, kernel_value)  # inside a traced step
    """
    if x.shape.rank != 2 or kernel.shape.rank != 2 or kernel.dtype != x.dtype:
        return None
    concat = stitch_concat_source(x, x.shape[1])
    if concat is None:
        return None
    out = matmul_of_stitch_concat(concat, kernel)
    out.set_shape([x.shape[0], kernel.shape[1]])
    return out

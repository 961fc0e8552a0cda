"""The FM interaction fusion: ``square(sum_f e_f) - sum_f e_f * e_f`` over stacked fields as one StitchFM.

A factorization machine's pairwise term (DeepFM's ``FM`` layer, or the same
lines written by hand) stacks the fields' embeddings into ``x`` (``[B, F, d]``)
and computes

    square_of_sum = tf.square(tf.reduce_sum(x, axis=1, keepdims=True))
    sum_of_square = tf.reduce_sum(x * x, axis=1, keepdims=True)   # or tf.square(x)
    cross = square_of_sum - sum_of_square

When ``x`` is a fused concatenation of packed fields (a StitchConcat of
fields only, all of width ``d``, seen as ``[B, F, d]``), ``fused_fm`` (called by
``dataflow_fusion``'s rule for every ``Sub``) replaces ``cross`` with one StitchFM on
the concatenation's inputs: the stacked matrix, its square, both sums and,
backward, their chain of Tile / Mul / AddN and the concatenation's gradient
become two ops reading the distinct rows. What follows (``0.5 *
reduce_sum(cross, axis=2)``) stays as written. Matched by dataflow, not by
layer class: with or without ``keepdims`` (and a ``Squeeze`` after it),
``tf.square`` or a product with itself, ``Identity`` in between.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.rewrite.concat_fusion import FLOAT_DTYPES, is_layout_op, stitch_concat_source
from hybridtf._src.run.stitch_fm import fm_of_stitch_concat


def _skip_identity(t: tf.Tensor) -> tf.Tensor:
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _skip_layout(t: tf.Tensor) -> tf.Tensor:
    """``t`` seen through shape-only ops (``Squeeze`` of a keepdims sum; the caller checks the shapes)."""
    while is_layout_op(t.op):
        t = t.op.inputs[0]
    return t


def _field_axis_sum(t: tf.Tensor) -> tf.Tensor | None:
    """``x`` when ``t`` is ``reduce_sum(x, axis=1)`` of a rank-3 ``x`` (keepdims either way), else None."""
    t = _skip_layout(t)
    if t.op.type != "Sum":
        return None
    x, axis = t.op.inputs
    axis = tf.get_static_value(axis)
    if axis is None or x.shape.rank != 3:
        return None
    axis = np.asarray(axis).reshape(-1)
    if axis.size != 1 or int(axis[0]) % 3 != 1:
        return None
    return x


def _square_of(t: tf.Tensor) -> tf.Tensor | None:
    """``x`` when ``t`` is ``tf.square(x)`` or ``x * x``, else None."""
    t = _skip_identity(t)
    if t.op.type == "Square":
        return t.op.inputs[0]
    if t.op.type == "Mul" and _skip_identity(t.op.inputs[0]) is _skip_identity(t.op.inputs[1]):
        return t.op.inputs[0]
    return None


def fm_stacked_input(op: tf.Operation) -> tf.Tensor | None:
    """The stacked ``x`` ``[B, F, d]`` when ``op`` (a ``Sub``) is ``square(sum_1 x) - sum_1 square(x)``."""
    if op.type != "Sub" or len(op.inputs) != 2:
        return None
    first, second = op.inputs
    if not (first.shape.is_compatible_with(second.shape) and first.shape.rank in (2, 3)):
        return None  # a broadcasting difference is not the cross term
    summed = _square_of(_skip_layout(first))
    x = _field_axis_sum(summed) if summed is not None else None
    squares = _field_axis_sum(second)
    y = _square_of(squares) if squares is not None else None
    if x is None or y is None or _skip_identity(x) is not _skip_identity(y):
        return None
    return x


def fused_fm(op: tf.Operation) -> tf.Tensor | None:
    """One StitchFM (``[B, d]``) for ``op`` when it is an FM cross term over fused packed fields, else None.

    The caller reshapes it to the ``Sub``'s shape (``[B, d]`` or ``[B, 1, d]``).
    """
    x = fm_stacked_input(op)
    if x is None or x.dtype not in FLOAT_DTYPES:
        return None
    dims = x.shape.as_list()
    out = op.outputs[0].shape.as_list()
    if dims[1] is None or dims[2] is None or out[-1] != dims[2] or any(d != 1 for d in out[1:-1]):
        return None  # the Sub must hold [B, d] (or [B, 1, d]) cross terms
    concat = stitch_concat_source(x, dims[1] * dims[2])
    if concat is None or concat.get_attr("num_dense") != 0 or len(concat.get_attr("piece_groups")) != dims[1]:
        return None
    rows = concat.inputs[: concat.get_attr("num_groups")]
    if any(r.shape.rank != 2 or r.shape[1] != dims[2] for r in rows):
        return None
    return fm_of_stitch_concat(concat)

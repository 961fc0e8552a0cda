"""Python wrapper and gradient of the fused ``HybridTF>StitchCombine`` op."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.run import gradient_arrivals
from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.second_order import TABLE_FIX, refuse_second_order

OP_NAME = "HybridTF>StitchCombine"
GRAD_OP_NAME = "HybridTF>StitchCombineGrad"
COMBINERS = ("none", "sum", "mean", "sqrtn")

# Second-order gradients are not provided.
refuse_second_order(GRAD_OP_NAME, TABLE_FIX)  # no second-order gradient: refused by name


def _int64_vector(value, what: str) -> tf.Tensor:
    t = tf.convert_to_tensor(value, dtype_hint=tf.int64)
    if not t.dtype.is_integer:
        raise TypeError(f"{what} must be integers, got {t.dtype.name}.")
    return tf.reshape(tf.cast(t, tf.int64), [-1])


def stitch_combine(
    rows,
    inverse,
    field_sizes,
    combiners: Sequence[str],
    *,
    field_segments=None,
    segment_lengths=None,
    weights=None,
    id_shapes=None,
    name: str | None = None,
) -> list[tf.Tensor]:
    """Builds every field's output from the gathered rows of distinct ids, in one op.

    PICASSO's Stitch&Combine: after a packed lookup gathered ``rows[u]`` for the
    distinct ids, each field's output is stitched back through the inverse
    index and, for multi-hot fields, pooled by its combiner — one kernel for all
    fields instead of a gather + segment-reduce chain per field.

    Field ``f`` owns ``field_sizes[f]`` consecutive positions of ``inverse``.
    With combiner ``"none"`` (one-hot) its output is ``rows[inverse[i]]`` for
    each position, shape ``[field_sizes[f], dim]``. With ``"sum"``, ``"mean"``
    or ``"sqrtn"`` (multi-hot) its positions form ``field_segments[f]`` bags
    whose lengths are the next ``field_segments[f]`` entries of
    ``segment_lengths``; output shape ``[field_segments[f], dim]``. Weighted
    bags follow ``tf.nn.embedding_lookup_sparse``: mean divides by the sum of
    weights, sqrtn by the root of the sum of squared weights. Empty bags give
    zero rows.

    The gradient with respect to ``rows`` is one fused op too: each distinct
    row's gradient is summed over its positions in ascending position order.
    ``weights`` are not differentiated (their gradient is None).

    Args:
        rows: ``[num_unique, dim]`` float32/float64, the gathered rows.
        inverse: ``[n]`` int32/int64, position -> row index (from ``unique_partition``).
        field_sizes: ``[num_fields]`` ints, positions per field (sum == n).
        combiners: one of ``"none" | "sum" | "mean" | "sqrtn"`` per field.
        field_segments: ``[num_fields]`` bags per field (ignored for "none"
            fields); defaults to ``field_sizes`` (every bag of length 1).
        segment_lengths: lengths of all bags of the bag fields, concatenated
            in field order; defaults to ones.
        weights: optional ``[n]`` per-position weights (dtype of ``rows``).
        id_shapes: optional, one entry per field: the shape of a one-hot field's
            ids (``tf.TensorShape``-like, rank >= 1, at most one unknown
            dimension), whose output then has that shape plus ``[dim]``
            (e.g. ids ``[B, 1]`` give ``[B, 1, dim]``: no reshape after the op),
            or None for ``[rows_f, dim]``.
        name: optional op name.

    Returns:
        A list with one ``[rows_f, dim]`` tensor per field (or, with
        ``id_shapes``, the field's ids' shape plus ``[dim]``).

    Raises:
        ValueError / TypeError: inconsistent static arguments.
        tf.errors.InvalidArgumentError: inconsistent sizes at run time.

    Example:
        >>> rows = tf.constant([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
        >>> inverse = tf.constant([0, 2, 1, 2, 0])
        >>> one_hot, bags = stitch_combine(
        ...     rows, inverse, field_sizes=[2, 3], combiners=["none", "mean"],
        ...     field_segments=[2, 2], segment_lengths=[1, 2])
        >>> one_hot.numpy().tolist(), bags.numpy().tolist()
        ([[1.0, 1.0], [4.0, 4.0]], [[2.0, 2.0], [2.5, 2.5]])
    """
    combiners = list(combiners)
    if not combiners:
        raise ValueError("stitch_combine needs at least one field (combiners is empty).")
    bad = [c for c in combiners if c not in COMBINERS]
    if bad:
        raise ValueError(f"combiners must be among {COMBINERS}, got {bad}.")
    with tf.name_scope(name or "stitch_combine"):
        rows = tf.convert_to_tensor(rows)
        if rows.dtype not in (tf.float32, tf.float64):
            raise TypeError(f"rows must be float32 or float64, got {rows.dtype.name}.")
        if rows.shape.rank is not None and rows.shape.rank != 2:
            raise ValueError(f"rows must be a matrix [num_unique, dim], got shape {rows.shape}.")
        inverse = tf.convert_to_tensor(inverse)
        if inverse.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"inverse must be int32 or int64, got {inverse.dtype.name}.")
        sizes = _int64_vector(field_sizes, "field_sizes")
        if sizes.shape[0] is not None and sizes.shape[0] != len(combiners):
            raise ValueError(f"field_sizes has {sizes.shape[0]} entries but there are {len(combiners)} combiners.")
        segments = sizes if field_segments is None else _int64_vector(field_segments, "field_segments")
        if segment_lengths is None:
            bags = [f for f, c in enumerate(combiners) if c != "none"]
            if bags and sizes.shape[0] is None:
                # padded to one entry per combiner: a field_sizes of another length (unknown when traced)
                # reaches the kernel, whose error says so, instead of failing in a slice here
                padded = tf.pad(sizes, [[0, tf.maximum(len(combiners) - tf.size(sizes, out_type=tf.int32), 0)]])
                total = tf.reduce_sum(tf.gather(padded, bags))
            else:
                total = tf.add_n([sizes[f] for f in bags]) if bags else 0
            lengths = tf.ones([total], tf.int64)
        else:
            lengths = _int64_vector(segment_lengths, "segment_lengths")
        weights = tf.zeros([0], rows.dtype) if weights is None else tf.cast(weights, rows.dtype)
        shapes = _id_shapes(id_shapes, combiners)
        return load_ops().hybrid_tf_stitch_combine(
            rows, inverse, sizes, segments, lengths, weights, num_fields=len(combiners), combiners=combiners, **shapes
        )


def _id_shapes(id_shapes, combiners) -> dict:
    """The ``id_shapes`` attribute (absent when no field has one: the op's default)."""
    if id_shapes is None:
        return {}
    id_shapes = list(id_shapes)
    if len(id_shapes) != len(combiners):
        raise ValueError(f"id_shapes has {len(id_shapes)} entries but there are {len(combiners)} combiners.")
    out = []
    for f, (given, combiner) in enumerate(zip(id_shapes, combiners)):
        shape = tf.TensorShape(given)
        if shape.rank is not None:
            unknown = sum(d is None for d in shape.as_list())
            if combiner != "none" or shape.rank < 1 or unknown > 1:
                raise ValueError(
                    f"id_shapes[{f}] = {shape} must be the shape of a one-hot field's ids (rank >= 1, at most one "
                    f"unknown dimension) or None; field {f} has combiner {combiner!r}."
                )
        out.append(shape)
    if all(s.rank is None for s in out):
        return {}
    return {"id_shapes": out}


@tf.RegisterGradient(OP_NAME)
def _stitch_combine_grad(op, *grads):
    rows, inverse, sizes, segments, lengths, weights = op.inputs
    gradient_arrivals.note_fields(rows, [f for f, g in enumerate(grads) if not gradient_arrivals.is_zero_fill(g)])
    dense = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g) for g, out in zip(grads, op.outputs)]
    d_rows = load_ops().hybrid_tf_stitch_combine_grad(
        dense,
        inverse,
        sizes,
        segments,
        lengths,
        weights,
        tf.shape(rows, out_type=tf.int64)[0],
        combiners=op.get_attr("combiners"),
    )
    return [d_rows, None, None, None, None, None]

"""Python wrapper and gradient of the fused ``HybridTF>StitchFM`` op (a factorization machine's interaction)."""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.second_order import FUSION_FIX, refuse_second_order
from hybridtf._src.run.stitch_concat import OP_NAME as STITCH_CONCAT
from hybridtf._src.run.stitch_concat import _op_layout, note_placed_fields

OP_NAME = "HybridTF>StitchFM"
GRAD_OP_NAME = "HybridTF>StitchFMGrad"

refuse_second_order(GRAD_OP_NAME, FUSION_FIX)  # no second-order gradient: refused by name


def fm_of_stitch_concat(concat: tf.Operation) -> tf.Tensor:
    """``square(sum_f e_f) - sum_f square(e_f)`` (``[batch, dim]``) over the fields of a StitchConcat op.

    ``concat`` must place fields only (no dense input), all of one dim: its
    output, seen as ``[batch, fields, dim]``, is the FM layer's stacked input.
    The fields are read from the packed tables' distinct rows; the stacked
    matrix is never written, forward or backward.

    Raises:
        ValueError: ``concat`` is not a StitchConcat op of fields of one dim.

    Example:
        >>> fm = fm_of_stitch_concat(stacked.op)  # == square(reduce_sum(x, 1)) - reduce_sum(x * x, 1)
    """
    if concat.type != STITCH_CONCAT:
        raise ValueError(f"fm_of_stitch_concat needs a {STITCH_CONCAT} op, got {concat.type}.")
    lists, attrs = _op_layout(concat)
    rows, dense = lists[0], lists[5]
    dims = {r.shape[1] for r in rows}
    if dense or len(dims) != 1 or None in dims:
        raise ValueError("fm_of_stitch_concat needs fields only, all of one static dim.")
    return load_ops().hybrid_tf_stitch_fm(*lists, **attrs)[0]


@tf.RegisterGradient(OP_NAME)
def _stitch_fm_grad(op, grad, grad_sums):
    # The second output (sum_f e_f per row) is there for this gradient; the tape and
    # tf.gradients pass zeros for an output nothing reads (and x + 0 == x).
    lists, attrs = _op_layout(op)
    note_placed_fields(lists[0], attrs)
    d_rows = load_ops().hybrid_tf_stitch_fm_grad(grad, op.outputs[1], grad_sums, *lists, **attrs)
    return [*d_rows, *([None] * (4 * len(lists[0])))]

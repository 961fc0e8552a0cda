"""Micro-batches from the MLP that keep the dense fusions: one StitchCombine per micro-batch.

``interleave_from="mlp_fused"`` (``"mlp"`` slices, see ``micro_batch.py``
for why that is the default) runs the lookup chains once on the whole batch and
the layers after them per micro-batch. Slicing the chains' outputs
(``output[lo:hi]``) would hide from the dataflow fusions that a piece is a
packed lookup field, so the concatenation and the first Dense layer would run
unfused. Instead, each micro-batch gets its own ``StitchCombine`` on the
chain's gathered distinct rows (the same ``rows`` tensor for every
micro-batch) with the slice of the inverse index that belongs to its
examples; the fusions then see fields as usual (``StitchConcat``,
``StitchConcatMatMul``).

Field ``f`` of a StitchCombine owns ``sizes[f]`` consecutive positions of the
inverse index. A one-hot field has ``sizes[f] / B`` positions per example; a bag
field has ``segments[f] / B`` bags per example whose positions follow from the
bags' lengths (a cumulative sum). Micro-batch ``[lo, hi)`` takes those
positions of every field (and their weights), and its bags' lengths.

Backward, the micro-batch's gradient is taken with respect to ``rows``: the
micro-batches' row gradients are summed and sent back through the chain once
(``output_gradients`` of the whole-batch tape), so each table still gets one
update with distinct rows.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.rewrite.concat_fusion import is_layout_op
from hybridtf._src.run.stitch_combine import OP_NAME as STITCH_COMBINE
from hybridtf._src.run.stitch_combine import stitch_combine


def _source(t):
    """``(StitchCombine op, field)`` whose output ``t`` is (through shape-only ops), else None."""
    if not isinstance(t, tf.Tensor) or t.shape.rank is None or t.shape.rank < 2:
        return None
    src = t
    while is_layout_op(src.op):
        src = src.op.inputs[0]
    if src.op.type != STITCH_COMBINE:
        return None
    weights = src.op.inputs[5]
    if weights.shape.rank != 1 or weights.shape[0] is None:
        return None  # weights of unknown length: cannot tell weighted from unweighted statically
    if t.shape[1:].num_elements() is None:
        return None
    return src.op, src.value_index


class MicroBatchStitch:
    """Per micro-batch StitchCombines for the whole-batch lookup ``outputs`` that come from one.

    Args:
        outputs: the lookup outputs, one per request (dense tensors or ragged).
        batch: the whole batch's size (a scalar tensor).
        enabled: False: every output is sliced (``interleave_from="mlp"``).
    """

    def __init__(self, outputs, batch, enabled: bool = True):
        self.outputs = list(outputs)
        self.batch = tf.cast(batch, tf.int64)
        self.sources = [_source(o) if enabled else None for o in self.outputs]
        self.ops = []
        for src in self.sources:
            if src is not None and all(src[0] is not op for op in self.ops):
                self.ops.append(src[0])
        self.rows = [op.inputs[0] for op in self.ops]

    @property
    def restitched(self) -> list[int]:
        """Indices of the outputs served by a per-micro-batch StitchCombine."""
        return [i for i, s in enumerate(self.sources) if s is not None]

    def micro_batch(self, lo, hi) -> list:
        """The outputs for rows ``[lo, hi)``: re-stitched where possible, else sliced."""
        fields = {id(op): _stitch(op, lo, hi, self.batch) for op in self.ops}
        n = hi - lo
        out = []
        for o, src in zip(self.outputs, self.sources):
            if src is None:
                out.append(o[lo:hi])
                continue
            field = fields[id(src[0])][src[1]]
            if o.shape.rank == 2 and o.op is src[0]:
                out.append(field)
            else:
                shaped = tf.reshape(field, tf.concat([[tf.cast(n, tf.int32)], tf.shape(o)[1:]], 0))
                shaped.set_shape([None, *o.shape[1:]])
                out.append(shaped)
        return out


def _stitch(op, lo, hi, batch) -> list[tf.Tensor]:
    rows, inverse, sizes, segments, lengths, weights = op.inputs
    combiners = [c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners")]
    lo, hi = tf.cast(lo, tf.int64), tf.cast(hi, tf.int64)
    weighted = weights.shape[0] != 0
    starts = tf.concat([[0], tf.cumsum(sizes)], 0)
    inv, w, new_sizes, new_segments, new_lengths = [], [], [], [], []
    bag_offset = tf.constant(0, tf.int64)
    for f, combiner in enumerate(combiners):
        if combiner == "none":
            per = sizes[f] // tf.maximum(batch, 1)
            a, z = starts[f] + lo * per, starts[f] + hi * per
            new_segments.append(z - a)
        else:
            per = segments[f] // tf.maximum(batch, 1)
            bags = lengths[bag_offset : bag_offset + segments[f]]
            ends = tf.concat([[0], tf.cumsum(bags)], 0)
            a, z = starts[f] + ends[lo * per], starts[f] + ends[hi * per]
            new_segments.append((hi - lo) * per)
            new_lengths.append(bags[lo * per : hi * per])
            bag_offset = bag_offset + segments[f]
        new_sizes.append(z - a)
        inv.append(inverse[a:z])
        if weighted:
            w.append(weights[a:z])
    return stitch_combine(
        rows,
        tf.concat(inv, 0),
        tf.stack(new_sizes),
        combiners,
        field_segments=tf.stack(new_segments),
        segment_lengths=tf.concat(new_lengths, 0) if new_lengths else tf.zeros([0], tf.int64),
        weights=tf.concat(w, 0) if weighted else None,
    )

"""Concatenations of packed lookups' outputs become one StitchConcat op.

CTR models concatenate their fields' embeddings (and the dense features)
before the MLP. With hundreds of fields the concatenation and, backward, its
split copy every embedding a second time in hundreds of narrow pieces, which
can cost as much as the lookups themselves. When a captured
``tf.keras.layers.Concatenate`` (last axis) is called while tracing and some of
its inputs are StitchCombine outputs (possibly reshaped from ``[B, 1, d]``), it
returns one ``StitchConcat`` instead: the fields are stitched straight into
their columns from the gathered rows.
The StitchCombine outputs it replaces are then unused, and TensorFlow prunes
the op when none of its outputs is used elsewhere. The values are the same;
gradients differ only when a field also feeds other layers (its gradient is
then a sum of two parts, one per consumer; float rounding only).

No global patching: each ``Concatenate`` instance of an optimized model gets a
run-time subclass (same class name, same config) whose ``_merge_function``
tries the fusion and otherwise concatenates as usual. Eager calls and
SavedModel export always concatenate as usual.

Dense fusion: a ``tf.keras.layers.Dense`` whose input is such a fused
concatenation (the first layer of the MLP) computes ``concat @ kernel`` with one
``StitchConcatMatMul`` through the distinct rows: every distinct embedding row is
multiplied by its field's block of the kernel once per step instead of once per
occurrence, the concatenated matrix is never written, and the embedding rows'
gradients come out summed per distinct row. Same math; float rounding differs
(sums in another order). Its bias and activation are applied as Dense does.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.saved_model import save_context

from hybridtf._src.capture.subclassing import runtime_subclass
from hybridtf._src.run.stitch_combine import OP_NAME as STITCH_COMBINE
from hybridtf._src.run.stitch_concat import OP_NAME as STITCH_CONCAT
from hybridtf._src.run.stitch_concat import StitchGroup, matmul_of_stitch_concat, stitch_concat

# Ops that only change a tensor's shape, never the row-major order of its values.
_LAYOUT_OPS = ("Identity", "Reshape", "ExpandDims", "Squeeze")


def _stitch_source(t):
    """``(op, field)`` if the graph tensor ``t`` is an unweighted StitchCombine output, else None.

    Shape-only ops in between are seen through when they keep the rows: a field
    looked up with ids of shape ``[B, 1]`` gives ``[B, 1, d]``, which a
    ``Flatten`` or ``Reshape`` turns back into ``[B, d]`` (the same values in the
    same order as the StitchCombine output ``[B, d]``).
    """
    width = t.shape[-1] if t.shape.rank else None
    while t.op.type in _LAYOUT_OPS and t.op.inputs:
        t = t.op.inputs[0]
    op = t.op
    if op.type != STITCH_COMBINE or t.shape.rank != 2 or t.shape[1] is None or t.shape[1] != width:
        return None
    weights = op.inputs[5]
    if weights.shape.rank != 1 or weights.shape[0] != 0:
        return None
    return op, t.value_index


def fused_concat(inputs, axis: int):
    """One StitchConcat equal to ``tf.concat(inputs, axis)``, or None when it does not apply.

    It applies in graph mode (tf.function), on the last axis of rank-2 float
    inputs with static widths, when at least one input is a StitchCombine output.

    Example:
        >>> fused_concat([emb_a, dense, emb_b], -1)  # inside a traced step: one op
    """
    if tf.executing_eagerly() or save_context.in_save_context() or len(inputs) < 2:
        return None
    if any(not isinstance(t, tf.Tensor) or t.shape.rank != 2 or t.shape[1] is None for t in inputs):
        return None
    if axis not in (-1, 1) or len({t.dtype for t in inputs}) != 1 or inputs[0].dtype not in (tf.float32, tf.float64):
        return None
    groups: dict[str, int] = {}
    group_ops: list = []
    dense: list = []
    pieces: list[tuple[int, int]] = []
    placed: set = set()
    for t in inputs:
        source = _stitch_source(t)
        if source is not None and (source[0].name, source[1]) not in placed:
            op, field = source
            if op.name not in groups:
                groups[op.name] = len(group_ops)
                group_ops.append(op)
            placed.add((op.name, field))
            pieces.append((groups[op.name], field))
        else:
            pieces.append((-1, len(dense)))
            dense.append(t)
    if not group_ops:
        return None
    stitch_groups = [
        StitchGroup(
            *op.inputs[:5], combiners=tuple(c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners"))
        )
        for op in group_ops
    ]
    out = stitch_concat(stitch_groups, dense, pieces)
    out.set_shape([inputs[0].shape[0], sum(int(t.shape[1]) for t in inputs)])
    return out


class _FusedConcatenateMixin:
    """Per-instance override of a ``tf.keras.layers.Concatenate`` in an optimized model."""

    @tf.autograph.experimental.do_not_convert
    def _merge_function(self, inputs):
        out = fused_concat(list(inputs), self.axis)
        if out is None:
            return super()._merge_function(inputs)
        object.__setattr__(self, "_htf_concat_fused", True)  # for model.hybridtf_fused_concats
        return out


def fused_dense_matmul(inputs, kernel):
    """``inputs @ kernel`` as one StitchConcatMatMul when ``inputs`` is a fused concatenation, else None.

    Example:
        >>> fused_dense_matmul(concat_output, dense_layer.kernel)  # inside a traced step
    """
    if tf.executing_eagerly() or save_context.in_save_context() or not isinstance(inputs, tf.Tensor):
        return None
    t = inputs
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    if t.op.type != STITCH_CONCAT or t.shape.rank != 2 or kernel.dtype != t.dtype or kernel.shape.rank != 2:
        return None
    out = matmul_of_stitch_concat(t.op, kernel)
    out.set_shape([inputs.shape[0], kernel.shape[1]])
    return out


class _FusedDenseMixin:
    """Per-instance override of a ``tf.keras.layers.Dense`` in an optimized model."""

    @tf.autograph.experimental.do_not_convert
    def call(self, inputs):
        outputs = None
        if isinstance(inputs, tf.Tensor) and inputs.dtype == self._compute_dtype_object:
            outputs = fused_dense_matmul(inputs, self.kernel)
        if outputs is None:
            return super().call(inputs)
        object.__setattr__(self, "_htf_dense_fused", True)
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs


def fuse_dense_layers(model: tf.keras.Model) -> list:
    """Gives every plain ``Dense`` layer of ``model`` the fusing subclass; returns the layers.

    A subclass of Dense that overrides ``call`` is left alone (its own call must run).

    Example:
        >>> [layer.name for layer in fuse_dense_layers(model)]
        ['dense', 'dense_1', 'dense_2']
    """
    layers = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, tf.keras.layers.Dense) or isinstance(layer, _FusedDenseMixin):
            continue
        if type(layer).call is not tf.keras.layers.Dense.call:
            continue
        layer.__dict__.pop("call", None)
        layer.__class__ = runtime_subclass(_FusedDenseMixin, type(layer))
        layers.append(layer)
    return layers


def fuse_concatenates(model: tf.keras.Model) -> list[str]:
    """Gives every ``Concatenate`` layer of ``model`` the fusing subclass; returns their names.

    Example:
        >>> fuse_concatenates(model)
        ['deep_concat']
    """
    names = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, tf.keras.layers.Concatenate) and not isinstance(layer, _FusedConcatenateMixin):
            layer.__dict__.pop("call", None)
            layer.__class__ = runtime_subclass(_FusedConcatenateMixin, type(layer))
            names.append(layer.name)
    return names

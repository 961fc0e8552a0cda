"""Fusions of what consumes packed lookups, matched on the ops the forward pass creates.

While a wrapped model's forward pass is traced (the replay pass, in which the
captured lookups return their packed chains' StitchCombine outputs), a
thread-local TensorFlow op callback (``op_callbacks.add_op_callback``; no
global patching) sees every op the user's code creates, whichever Keras layer,
DeepCTR layer, custom layer or plain ``tf.*`` call created it. Each op type
has one rule (``RULES``, op type -> rule) that returns replacement outputs, or
None to keep the op:

* ``ConcatV2`` / ``Pack`` along a non-batch axis with at least one field among
  its pieces (through ``Reshape`` / ``ExpandDims`` / ``Squeeze`` /
  ``Identity``, e.g. ``Flatten`` of a ``[B, 1, d]`` lookup), or the output of
  another fused concatenation: one ``StitchConcat`` (reshaped to the output's
  shape when that is not a matrix);
* ``AddN`` / ``AddV2`` of fields of one shape (Keras ``Add`` is a chain of
  ``AddV2``; each step's partial sum is recognised by the next), or a ``Sum``
  over the axis of an unfused stack of them (``reduce_sum(tf.stack(fields), 0)``): deferred, not
  replaced; the first op that uses the sum otherwise (or the caller, through
  ``FusionScope.resolve``) gets one StitchConcat and one sum over the fields
  that rounds as the plain graph's ``AddN`` does (``add_n_sum``). Its gradient
  is a column broadcast that StitchConcatGrad reads without materialising it
  (dim-1 fields: the wide part);
* ``MatMul`` whose left operand is a fused concatenation (a ``Dense`` on it,
  the MLP's first layer): one ``StitchConcatMatMul``;
* otherwise, a ``MatMul`` of DIN's attention input ``[q, k, q - k, q * k]``
  with a repeated query: the query's block once per example
  (``attention_fusion``);
* ``BatchMatMulV2`` of ``[..., m, 1]`` by ``[..., 1, n]`` (DCN's cross layer):
  a broadcast ``Mul`` (the same products, no batched GEMM per example);
* ``Sub`` computing a factorization machine's cross term
  ``square(reduce_sum(x, 1)) - reduce_sum(x * x, 1)`` over a fused
  concatenation of fields: one ``StitchFM`` (``fm_fusion``);
* ``AddV2`` completing DIN's Dice activation, ``alpha * (1 - p) * x + p * x``
  with ``p`` the sigmoid of ``x``'s train-mode batch normalization (no
  offset, no scale): one ``Dice`` op, the batch statistics' other consumers
  (the moving averages) redirected to its mean and variance (``dice_fusion``).

Every replacement whose original output had a fully static shape is reshaped
to it (``_as_traced``), so that Grappler sees the shapes it saw in the plain
graph and optimizes the rest of the step the same way.

The callback runs after the op wrapper has created the original op and
before the wrapper records it on the gradient tape; the wrapper then records
the ORIGINAL op type with the op's inputs and the replacement outputs, which
would send the replacement's gradient through the original op (right values,
unfused backward). So before returning, the rule's original op gets its
float inputs rewired (``Operation._update_input``) to copies made under
``record.stop_recording()``: the tape does not track them, the wrapper's
record is skipped, and the replacement ops (created inside the callback, which
TensorFlow does not call back for) keep their own tape records. The original
op is left without consumers and pruned before the step runs. Values the
user's code sees are always real, tracked tensors, so an op no rule knows
keeps its ordinary gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.framework import op_callbacks
from tensorflow.python.saved_model import save_context

from hybridtf._src.rewrite.add_n_rounding import add_n_order, add_n_sum, node_input_name
from hybridtf._src.rewrite.attention_fusion import query_key_matmul
from hybridtf._src.rewrite.concat_fusion import (
    FLOAT_DTYPES,
    ColumnLayout,
    column_view,
    field_source,
    fused_matmul,
    stitch_concat_source,
)
from hybridtf._src.rewrite.dice_fusion import fused_dice
from hybridtf._src.rewrite.fm_fusion import fused_fm


@dataclasses.dataclass
class FusionLog:
    """What one traced forward pass fused, by where it happened.

    Attributes:
        concats: concatenations and field sums turned into StitchConcat, named
            by the innermost Keras layer whose call created them (the op name
            when the model's own ``call`` did), in trace order, without repeats.
        dense: matrix products turned into StitchConcatMatMul, named the same way.
        outer_products: batched 1-deep matrix products turned into a broadcast ``Mul``.
        attention: DIN attention inputs' products computed from the query once per example
            (``attention_fusion``).
        fm: factorization-machine cross terms turned into StitchFM (``fm_fusion``).
        dice: Dice activations with train-mode batch normalization turned into one Dice op (``dice_fusion``).
    """

    concats: list[str] = dataclasses.field(default_factory=list)
    dense: list[str] = dataclasses.field(default_factory=list)
    outer_products: list[str] = dataclasses.field(default_factory=list)
    attention: list[str] = dataclasses.field(default_factory=list)
    fm: list[str] = dataclasses.field(default_factory=list)
    dice: list[str] = dataclasses.field(default_factory=list)


def _static_target(out: tf.Tensor) -> list[int] | None:
    """``[-1, d1, d2, ...]`` for ``out``'s shape when every dim but the batch is static."""
    dims = out.shape.as_list() if out.shape.rank is not None else None
    if not dims or any(d is None for d in dims[1:]):
        return None
    return [-1, *dims[1:]]


def _as_traced(fused: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
    """``fused`` (values of ``out``) with ``out``'s shape, as TensorFlow's C++ shape inference will see it.

    The fused ops' shape functions cannot know the batch size (it is a runtime
    value of the packed chain), while the op they replace had it statically
    (e.g. Keras ``train_on_batch`` traces with the batch's shape). Grappler
    re-infers shapes from the graph, not from Python's ``set_shape``, and some
    of its rewrites (the arithmetic optimizer's) only fire on known shapes:
    without the static shape the fused graph would be optimized differently
    from the plain one, and its float results would round differently
    downstream (xDeepFM's CIN drifted so). A reshape to the static shape (no
    copy) gives Grappler what the original op gave it; with an unknown batch,
    the shape is only set for Python.
    """
    if out.shape.is_fully_defined():
        return tf.reshape(fused, out.shape.as_list())
    target = _static_target(out)
    if target is not None and fused.shape.rank != out.shape.rank:
        fused = tf.reshape(fused, target)
    fused.set_shape(out.shape)
    return fused


def _same_shape(a: tf.TensorShape, b: tf.TensorShape) -> bool:
    if a.rank is None or a.rank != b.rank:
        return False
    return all(x == y for x, y in zip(a.as_list(), b.as_list()))


def _normalize(axis, rank: int) -> int | None:
    axis = tf.get_static_value(axis) if isinstance(axis, tf.Tensor) else axis
    if axis is None or getattr(axis, "ndim", 0) != 0:
        return None
    axis = int(axis)
    return axis + rank if axis < 0 else axis


class FusionScope:
    """The op callback of one traced forward pass (see the module docstring).

    Args:
        fuse_dense: also turn ``MatMul``s of fused concatenations into StitchConcatMatMul: ``True`` where it
            pays (at most ``DENSE_FUSION_MAX_UNITS`` output columns), ``"always"``, or ``False``.
        model: the model whose forward pass this is (ops of its own ``call`` are named by op name).
        forward_only: a TF1 model_fn's pass, which also builds its backward pass: ops ``tf.gradients`` or a
            tape builds and ops on Keras symbolic tensors are left as built; fusions are named by op name.
    """

    def __init__(self, fuse_dense: bool | str = True, model=None, forward_only: bool = False):
        self.fuse_dense = fuse_dense
        self.model = model
        self.forward_only = forward_only
        self.log = FusionLog()
        self._pending: dict = {}  # ref of a user's field sum -> (the fields it adds, where it was written)
        self._named: dict = {}  # layer name -> id of the first layer ``where`` gave it to
        self._fused_sums: dict = {}  # ref of a user's field sum -> its fused replacement, once a consumer needs it
        self._untracked: dict = {}

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        # TensorFlow hands the callback ``tuple(op.outputs)`` and uses what it returns as the op's
        # outputs: return a list, as ``op.outputs`` is (``tf.unstack``'s caller may ``.reverse()`` it,
        # as Keras' backward RNN does), and never None (that would drop an earlier callback's outputs).
        result = self._rewrite(op_type, inputs, outputs, op_name, graph)
        return None if result is None else list(result)

    def _rewrite(self, op_type, inputs, outputs, op_name, graph):
        if graph is None or outputs is None or not inputs:
            return outputs
        rule = RULES.get(op_type)
        if rule is None and not self._pending and op_type not in DEFERRED_SUM_OPS:
            return outputs
        if self.forward_only and (_in_symbolic_gradients() or _keras_symbolic(inputs)):
            return outputs  # a TF1 model_fn's optimizer builds its backward as usual; Keras records its own graph
        # by name: an earlier callback may have replaced ``outputs`` already
        op = graph.get_operation_by_name(op_name) if op_name else outputs[0].op
        if self._defer_sum(op):
            return outputs
        if self._pending:
            self._materialize_inputs(op)
        if rule is None:
            return outputs
        try:
            replaced = rule(self, op)
        except (ValueError, TypeError):  # a shape or dtype this rewrite does not cover: keep the op
            replaced = None
        if replaced is None:
            return outputs
        self._detach(op)
        return replaced

    def _detach(self, op: tf.Operation) -> None:
        """Points ``op``'s float inputs at untracked copies, so its wrapper does not record it."""
        for i, t in enumerate(op.inputs):
            if not (t.dtype.is_floating or t.dtype.is_complex):
                continue
            copy = self._untracked.get(t.ref())
            if copy is None:
                with record.stop_recording():
                    copy = tf.identity(t)
                self._untracked[t.ref()] = copy
            op._update_input(i, copy)

    def where(self, op: tf.Operation) -> str:
        """The innermost Keras layer being called (its name), else ``op``'s name.

        Layers nested in different parents may share a name (DeepCTR's ``dice``
        inside each ``DNN``): a second layer of a name already given is named by
        its path in ``op``'s name scope instead (``.../dnn_1/dice``).
        """
        from keras.src.engine import base_layer_utils

        layer = base_layer_utils.call_context().layer
        if layer is None or layer is self.model or self.forward_only:  # a TF1 model_fn: its graph's op names
            return op.name
        owner = self._named.setdefault(layer.name, id(layer))
        if owner == id(layer):
            return layer.name
        cut = op.name.rfind(f"/{layer.name}/")
        return op.name[: cut + len(layer.name) + 1] if cut >= 0 else f"{layer.name}@{op.name}"

    def note(self, kind: list, op: tf.Operation) -> None:
        name = self.where(op)
        if name not in kind:
            kind.append(name)

    def sum_terms(self, t: tf.Tensor):
        """The fields a user's field sum ``t`` adds up, or None."""
        entry = self._pending.get(t.ref())
        return None if entry is None else entry[0]

    def _defer_sum(self, op: tf.Operation) -> bool:
        """Records a field sum (or an Identity of one) without building anything yet (see ``_field_sum_terms``).

        A chain of adds creates one partial sum per field; fusing each would leave
        hundreds of dead fused sums in the traced step. The user's own adds stay
        (without a consumer once the sum is fused); the fused sum is built once,
        for the first op that uses the sum otherwise (``_materialize_inputs``).
        """
        if op.type == "Identity" and op.inputs and op.inputs[0].ref() in self._pending:
            self._pending[op.outputs[0].ref()] = self._pending[op.inputs[0].ref()]
            return True
        if op.type not in DEFERRED_SUM_OPS:
            return False
        try:
            terms = _field_sum_terms(self, op) if op.type in SUM_OPS else _stacked_sum_terms(self, op)
        except (ValueError, TypeError):
            terms = None
        if terms is None:
            return False
        self._pending[op.outputs[0].ref()] = (terms, self.where(op))
        return True

    def _fused_sum(self, t: tf.Tensor) -> tf.Tensor:
        fused = self._fused_sums.get(t.ref())
        if fused is None:
            terms, where = self._pending[t.ref()]
            fused = _build_field_sum(terms, t)
            self._fused_sums[t.ref()] = fused
            if where not in self.log.concats:
                self.log.concats.append(where)
        return fused

    def resolve(self, structure):
        """``structure`` (the forward pass's result) with each deferred field sum replaced by its fused sum.

        A sum the forward pass returns (a model whose output is its wide part) has
        no consumer inside the pass; the caller's ops (the loss) use the fused sum.
        So does a sum under a returned Keras sigmoid or softmax: Keras's
        cross-entropy losses read the activation's input (``_keras_logits``), not
        its output, and would otherwise train through the user's unfused adds.

        Example:
            >>> with fusing(model=model) as scope:
            ...     y = model_call(inputs)
            >>> y = scope.resolve(y)
        """

        def one(t):
            if not isinstance(t, tf.Tensor) or tf.executing_eagerly():
                return t
            if t.ref() in self._pending:
                return self._fused_sum(t)
            logits = getattr(t, "_keras_logits", None)
            if isinstance(logits, tf.Tensor) and logits.ref() in self._pending:
                t._keras_logits = self._fused_sum(logits)
            return t

        return tf.nest.map_structure(one, structure)

    def _materialize_inputs(self, op: tf.Operation) -> None:
        """Points ``op``'s inputs that are deferred field sums at their fused sums (built on first use).

        The op's gradient record, made after this callback, reads ``op.inputs``:
        the gradient flows into the fused sum, and the user's adds get none.
        """
        for i, t in enumerate(op.inputs):
            if t.ref() in self._pending:
                op._update_input(i, self._fused_sum(t))


def _columns(scope: FusionScope, op: tf.Operation, values, axis: int | None):
    """One StitchConcat for a concatenation (or stack) of ``values`` along ``axis``, or None."""
    out = op.outputs[0]
    if axis is None or axis < 1 or len(values) < 2 or out.dtype not in FLOAT_DTYPES:
        return None
    target = _static_target(out)
    widths = [column_view(t, axis) for t in values]
    if target is None or any(w is None for w in widths):
        return None
    if not any(_is_fusable_piece(t, w) for t, w in zip(values, widths)):
        return None
    layout = ColumnLayout()
    for t, w in zip(values, widths):
        layout.add(t, w)
    if layout.num_fields == 0:
        return None
    fused = _as_traced(layout.build(out.shape[0]), out)
    scope.note(scope.log.concats, op)
    return [fused]


def _is_fusable_piece(t: tf.Tensor, width: int) -> bool:
    src = field_source(t)
    return (src is not None and src[2] == width) or stitch_concat_source(t, width) is not None


def _concat_rule(scope: FusionScope, op: tf.Operation):
    values = op.inputs[:-1]
    rank = values[0].shape.rank if values else None
    if rank is None:
        return None
    return _columns(scope, op, values, _normalize(op.inputs[-1], rank))


def _pack_rule(scope: FusionScope, op: tf.Operation):
    rank = op.outputs[0].shape.rank
    if rank is None:
        return None
    return _columns(scope, op, op.inputs, _normalize(op.get_attr("axis"), rank))


def _field_sum_terms(scope: FusionScope, op: tf.Operation) -> list | None:
    """The fields an ``AddN`` / ``AddV2`` adds, when every term is a field (or a field sum) of the output's shape."""
    return _sum_terms_of(scope, list(op.inputs), op.outputs[0])


def _stacked_sum_terms(scope: FusionScope, op: tf.Operation) -> list | None:
    """The fields of ``reduce_sum(tf.stack(fields, axis=k), axis=k)``: a field sum written with a stack.

    Only a stack no rule fused (axis 0, the fields' own batch axis left in place); a stack along a later
    axis is a fused concatenation already, which the sum then reads.
    """
    if op.get_attr("keep_dims"):
        return None
    stack = op.inputs[0]
    if stack.op.type != "Pack" or len(stack.op.inputs) < 2 or stack.shape.rank is None:
        return None
    axis = tf.get_static_value(op.inputs[1])
    if axis is None or np.size(axis) != 1:
        return None
    rank = stack.shape.rank
    if _normalize(int(np.reshape(axis, [-1])[0]), rank) != _normalize(stack.op.get_attr("axis"), rank):
        return None
    return _sum_terms_of(scope, list(stack.op.inputs), op.outputs[0])


def _sum_terms_of(scope: FusionScope, inputs: list, out: tf.Tensor) -> list | None:
    """``inputs`` as the terms of a field sum ``out``, when each is a field (or a field sum) of ``out``'s shape."""
    if out.dtype not in FLOAT_DTYPES or out.shape.rank is None or out.shape.rank < 1:
        return None
    target = _static_target(out)
    if target is None:
        return None
    width = math.prod(target[1:])
    terms = []
    for t in inputs:
        if not _same_shape(t.shape, out.shape):
            return None
        prior = scope.sum_terms(t)
        if prior is not None:
            terms.extend(prior)
            continue
        src = field_source(t)
        if src is None or src[2] != width:
            return None
        terms.append(t)
    return terms if len(terms) >= 2 else None


def _build_field_sum(terms: list, out: tf.Tensor) -> tf.Tensor:
    """One StitchConcat of ``terms`` (fields of ``out``'s shape) and their sum in the plain graph's rounding."""
    width = math.prod(out.shape.as_list()[1:])
    layout = ColumnLayout()
    for i in add_n_order([node_input_name(t) for t in terms]):  # the plain graph's order (see add_n_sum)
        layout.add(terms[i], width)
    columns = layout.build(out.shape[0])
    if width == 1:  # the wide part: its gradient is a [B, 1] column that StitchConcatGrad reads in place
        total = add_n_sum(columns)
    else:
        total = add_n_sum(tf.reshape(columns, [-1, len(terms), width]))
    return _as_traced(total, out)


# StitchConcatMatMul adds each position's projected row (``units`` wide) into its output row: memory-bound
# once a batch's output rows leave the cache. Measured on 2 CPU cores, batch 4096, one-hot Zipf fields
# (26 or 200 fields of dim 4-32): with 64 units it matched or beat TensorFlow's matmul over the fused
# concatenation (200 fields: 25-27 vs 33-34 ms a step), with 128 it was 20% slower, with 256 up to 2.6x
# slower (26 fields of dim 4) and never faster. Wider products keep TensorFlow's matmul (on the
# StitchConcat output); ``fuse_dense="always"`` fuses them anyway.
DENSE_FUSION_MAX_UNITS = 64


def _fuses_dense(scope: FusionScope, kernel: tf.Tensor) -> bool:
    if scope.fuse_dense == "always":
        return True
    units = kernel.shape[-1] if kernel.shape.rank == 2 else None
    return bool(scope.fuse_dense) and units is not None and units <= DENSE_FUSION_MAX_UNITS


def _matmul_rule(scope: FusionScope, op: tf.Operation):
    if op.get_attr("transpose_a") or op.get_attr("transpose_b"):
        return None
    x, kernel = op.inputs
    fused = fused_matmul(x, kernel) if _fuses_dense(scope, kernel) else None
    if fused is None:
        fused = query_key_matmul(x, kernel)  # DIN's attention input (attention_fusion)
        if fused is None:
            return None
        scope.note(scope.log.attention, op)
        return [_as_traced(fused, op.outputs[0])]
    scope.note(scope.log.dense, op)
    return [_as_traced(fused, op.outputs[0])]


def _outer_product_rule(scope: FusionScope, op: tf.Operation):
    """``BatchMatMulV2`` of ``[..., m, 1]`` by ``[..., 1, n]``: an outer product per entry, as a broadcast ``Mul``.

    DCN's cross layer computes ``x0 @ (x_l . w)`` this way; a batched matmul of 1-deep matrices is one product
    per output value, exactly what ``Mul`` computes, without a batched GEMM call per example.
    """
    a, b = op.inputs
    if op.get_attr("adj_x") or op.get_attr("adj_y") or a.dtype not in FLOAT_DTYPES:
        return None
    if a.shape.rank is None or a.shape.rank < 3 or b.shape.rank != a.shape.rank:
        return None
    if a.shape[-1] != 1 or b.shape[-2] != 1:
        return None
    out = tf.multiply(a, b)
    out.set_shape(op.outputs[0].shape)
    scope.note(scope.log.outer_products, op)
    return [out]


def _one_op_rule(fuse, entry: str, doc: str):
    """A rule that replaces an op's single output by ``fuse(op)`` (None: keep the op), logged under ``entry``."""

    def rule(scope: FusionScope, op: tf.Operation):
        fused = fuse(op)
        if fused is None:
            return None
        scope.note(getattr(scope.log, entry), op)
        return [_as_traced(fused, op.outputs[0])]

    rule.__doc__ = doc
    return rule


_fm_rule = _one_op_rule(
    fused_fm, "fm", "A factorization machine's cross term over fused fields (a ``Sub``): one StitchFM (``fm_fusion``)."
)
_dice_rule = _one_op_rule(
    fused_dice,
    "dice",
    "DIN's Dice activation with train-mode batch normalization (an ``AddV2``): one Dice op (``dice_fusion``).",
)


# Sums of fields: deferred until a consumer needs them (FusionScope._defer_sum), then one StitchConcat and a sum.
SUM_OPS = frozenset({"AddN", "AddV2"})
DEFERRED_SUM_OPS = SUM_OPS | {"Sum"}  # also a reduce_sum over an unfused stack of fields (_stacked_sum_terms)

# Op type -> rule(scope, op) returning the replacement outputs, or None to keep the op.
RULES = {
    "ConcatV2": _concat_rule,
    "Pack": _pack_rule,
    "MatMul": _matmul_rule,
    "BatchMatMulV2": _outer_product_rule,
    "Sub": _fm_rule,
    "AddV2": _dice_rule,  # after _defer_sum: an AddV2 of fields is a field sum, never a Dice
}


def _keras_symbolic(inputs) -> bool:
    """Whether an op's inputs are a TF1 graph's Keras symbolic tensors: Keras rebuilds such ops from their
    definitions (a functional model's op layers), which a fused op's cannot be rebuilt from."""
    return any(getattr(t, "_keras_history", None) is not None for t in inputs)


def _in_symbolic_gradients(max_depth: int = 80) -> bool:
    """Whether ``tf.gradients`` (a TF1 optimizer's) or a tape's ``gradient`` is building ops (the Python stack)."""
    frame = sys._getframe(2)
    for _ in range(max_depth):
        if frame is None or frame.f_code.co_name in ("_GradientsHelper", "imperative_grad"):
            return frame is not None
        frame = frame.f_back
    return False


@contextlib.contextmanager
def fusing(enabled: bool = True, *, fuse_dense: bool | str = True, model=None, forward_only: bool = False):
    """Applies the dataflow fusions to the ops created inside (graph mode only); yields the scope or None.

    Eager execution and SavedModel export (``save_context``) run the user's ops
    as written.

    Example:
        >>> with context.replaying(requests, outputs), fusing(model=model) as scope:
        ...     y = model_call(inputs)
        >>> scope.log.concats
        ['deep_concat', 'wide_add']
    """
    if not enabled or tf.executing_eagerly() or save_context.in_save_context():
        yield None
        return
    scope = FusionScope(fuse_dense=fuse_dense, model=model, forward_only=forward_only)
    op_callbacks.add_op_callback(scope)
    try:
        yield scope
    finally:
        op_callbacks.remove_op_callback(scope)

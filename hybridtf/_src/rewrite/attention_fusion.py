"""DIN's attention input, ``[q, k, q - k, q * k] @ W``, without the repeated query and the 4d-wide concat.

DIN's local activation unit (DeepCTR's ``LocalActivationUnit``; the same
dataflow in hand-written DIN models) scores every behaviour ``k_t`` of a
``[B, T, d]`` sequence against the example's query ``q`` (``[B, 1, d]``)::

    queries = repeat(q, T, axis=1)                                  # [B, T, d]: T copies
    x = concat([queries, keys, queries - keys, queries * keys], -1)  # [B, T, 4d]
    y = x @ W                                                        # a Dense / tensordot: [B*T, 4d] @ [4d, n]

Rule (``query_key_matmul``, tried by ``dataflow_fusion``'s ``MatMul`` rule when
the dense fusion does not apply): a ``MatMul`` whose left operand is (through
``Reshape``/``Identity``, and the identity ``Transpose`` that ``tensordot`` adds
for a dynamic shape) such a concatenation along its last axis, whose first
piece repeats one ``[B, 1, d]`` query along axis 1 (a ``ConcatV2`` of copies,
as Keras ``repeat_elements`` builds it, a ``Tile``, or a ``BroadcastTo`` to the
keys' shape, also with a dynamic ``T``), becomes::

    y = reshape(concat([k, q - k, q * k], -1) @ W[d:], [B, T, n]) + (q @ W[:d])  # q: [B, 1, d], broadcast

The query's block is multiplied once per example instead of once per
behaviour, the ``[B, T, d]`` copies of the query and their gradient (a slice
and a sum per copy) disappear, and the concatenation is 3d wide instead of 4d.
``q - k`` and ``q * k`` are computed by broadcasting the same query values, so
they are bit for bit the model's; only the product's summation order changes
(the query block is added after the other three instead of among them).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.rewrite.concat_fusion import FLOAT_DTYPES


def _skip_identity(t: tf.Tensor) -> tf.Tensor:
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    return t


def _last_axis_concat(t: tf.Tensor):
    """The value inputs of ``t``'s ``ConcatV2`` along its last axis (rank 3), else None."""
    t = _skip_identity(t)
    if t.op.type != "ConcatV2" or t.shape.rank != 3:
        return None
    axis = tf.get_static_value(t.op.inputs[-1])
    if axis is None or int(axis) not in (-1, 2):
        return None
    return list(t.op.inputs[:-1])


def repeated_query(t: tf.Tensor, steps: int | None, keys: tf.Tensor) -> tf.Tensor | None:
    """The ``[B, 1, d]`` query that ``t`` (``[B, steps, d]``, shaped like ``keys``) repeats along axis 1, or None.

    ``steps`` None (a dynamic sequence length): only ``tf.broadcast_to(query, tf.shape(keys))``.
    """
    t = _skip_identity(t)
    op = t.op
    if op.type == "BroadcastTo":
        src, shape = op.inputs
        shape = _skip_identity(shape)
        if src.shape.rank != 3 or src.shape[1] != 1 or shape.op.type != "Shape":
            return None
        if _skip_identity(shape.op.inputs[0]) is not keys:
            return None
        return src  # broadcast to the keys' shape: the same values as q - k / q * k broadcast it
    if steps is None:
        return None
    if op.type == "ConcatV2":
        axis = tf.get_static_value(op.inputs[-1])
        pieces = op.inputs[:-1]
        if axis is None or int(axis) != 1 or len(pieces) != steps:
            return None
        first = pieces[0]
        if first.shape.rank != 3 or first.shape[1] != 1 or any(p is not first for p in pieces):
            return None
        return first
    if op.type == "Tile":
        multiples = tf.get_static_value(op.inputs[1])
        src = op.inputs[0]
        if multiples is None or src.shape.rank != 3 or src.shape[1] != 1:
            return None
        if [int(m) for m in multiples] != [1, steps, 1]:
            return None
        return src
    return None


def _uses(t: tf.Tensor, op_type: str, a: tf.Tensor, b: tf.Tensor, commutative: bool) -> bool:
    t = _skip_identity(t)
    if t.op.type != op_type or len(t.op.inputs) != 2:
        return False
    x, y = (_skip_identity(i) for i in t.op.inputs)
    return (x is a and y is b) or (commutative and x is b and y is a)


def query_key_matmul(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor | None:
    """``x @ kernel`` computed from the query once per example, when ``x`` is DIN's attention input; else None.

    Args:
        x: the ``MatMul``'s left operand, ``[B * T, 4d]``.
        kernel: its right operand, ``[4d, n]``.

    Returns:
        ``[B * T, n]``, the product's rows in ``x``'s order, or None when ``x`` is not
        ``reshape(concat([repeat(q), k, repeat(q) - k, repeat(q) * k], -1))``.

    Example:
        >>> y = query_key_matmul(att_input_2d, dense_kernel)  # inside a traced forward pass
    """
    if x.dtype not in FLOAT_DTYPES or x.shape.rank != 2 or kernel.shape.rank != 2 or kernel.dtype != x.dtype:
        return None
    src = _skip_identity(x)
    if src.op.type != "Reshape":
        return None
    inner = _skip_identity(src.op.inputs[0])
    if inner.op.type == "Transpose":  # tensordot with a dynamic shape transposes by a (computed) identity
        perm = tf.get_static_value(inner.op.inputs[1])
        if perm is None or list(perm) != list(range(len(perm))):
            return None
        inner = inner.op.inputs[0]
    pieces = _last_axis_concat(inner)
    if pieces is None or len(pieces) != 4:
        return None
    queries, keys, diff, prod = (_skip_identity(p) for p in pieces)
    shape = keys.shape
    if shape.rank != 3 or shape[2] is None:
        return None
    steps, d = (None if shape[1] is None else int(shape[1])), int(shape[2])
    if any(p.shape.rank != 3 or p.shape[2] != d for p in (queries, diff, prod)):
        return None
    if x.shape[1] not in (None, 4 * d) or kernel.shape[0] != 4 * d or kernel.shape[1] is None:
        return None
    if not _uses(diff, "Sub", queries, keys, False) or not _uses(prod, "Mul", queries, keys, True):
        return None
    query = repeated_query(queries, steps, keys)
    if query is None:
        return None
    units = int(kernel.shape[1])
    rest = tf.concat([keys, query - keys, query * keys], axis=-1)  # [B, T, 3d], the model's values
    keyed = tf.matmul(tf.reshape(rest, [-1, 3 * d]), kernel[d:])  # [B*T, n]
    queried = tf.matmul(tf.reshape(query, [-1, d]), kernel[:d])  # [B, n]
    per_step = [-1, steps if steps is not None else tf.shape(keys)[1], units]
    out = tf.reshape(tf.reshape(keyed, per_step) + tf.expand_dims(queried, 1), [-1, units])
    out.set_shape([x.shape[0], units])
    return out

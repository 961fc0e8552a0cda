"""The plain graph's rounding of a sum of fields, reproduced for a fused field sum (``dataflow_fusion``).

A model's wide part adds one column per field (Keras ``Add``, Python ``+``,
``tf.add_n``, ``reduce_sum`` of a stack). Grappler turns such a sum into one
``AddN`` with its inputs sorted by name, and the CPU ``AddN`` kernel adds
them in a fixed association. ``add_n_sum`` computes the same floats from the
fused ``StitchConcat`` columns, bit for bit, with a gradient that
StitchConcatGrad reads as a column (``add_n_order`` orders the columns).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.gradient_registry import graph_owned_gradients

ADD_N_CHUNK = 8  # TensorFlow's CPU AddN kernel adds its inputs eight at a time
FUSED_SUM_SCOPE = "fused_field_sum"  # name scope of add_n_sum's ops (its adds are not the user's)


def node_input_name(t: tf.Tensor) -> str:
    """How a GraphDef node names ``t`` among its inputs (``op`` for output 0, else ``op:k``)."""
    return t.op.name if t.value_index == 0 else f"{t.op.name}:{t.value_index}"


def add_n_order(names: list[str]) -> list[int]:
    """The order in which the plain graph adds terms named ``names`` (see ``add_n_sum``): sorted by name."""
    return sorted(range(len(names)), key=lambda i: names[i])


def _in_order(parts: list) -> tf.Tensor:
    """``parts[0] + parts[1] + ...`` strictly left to right (one ``AddV2`` per part, no reassociation)."""
    total = parts[0]
    for part in parts[1:]:
        total = tf.add(total, part)
    return total


def _column_sum(x: tf.Tensor, n: int) -> tf.Tensor:
    """``x[:, 0] + x[:, 1] + ... + x[:, n-1]`` strictly left to right, axis 1 kept (size 1).

    One ``Split`` and ``n - 1`` adds of whole ``[B, 1, ...]`` slices: each add is vectorised across the
    batch (and any inner axes). A ``cumsum`` along axis 1 gives the same floats but scans every row on its
    own: about 9x slower for a 200-field wide part (it was 9% of the fused step's op time).
    """
    return _in_order(tf.split(x, n, axis=1)) if n > 1 else x


def add_n_sum(x: tf.Tensor) -> tf.Tensor:
    """``_add_n_sum``, its custom gradient owned by the graph (``gradient_registry``)."""
    with graph_owned_gradients():
        return _add_n_sum(x)


@tf.custom_gradient
def _add_n_sum(x: tf.Tensor):
    """The sum over axis 1 of ``x`` (``[B, n, ...]``, n >= 2) rounded as TensorFlow's CPU ``AddN`` kernel rounds it.

    What the plain graph runs for a sum of fields: Grappler's arithmetic
    optimizer turns a chain of adds (Keras ``Add``, Python ``+``) into one
    ``AddN`` and sorts the inputs of commutative ops by name; ``tf.add_n`` is
    an ``AddN`` sorted the same way. The CPU ``AddN`` kernel then adds the
    first ``r`` inputs left to right (``r = n % 8``, or 8 for ``r == 0``, 9 for
    ``r == 1``) and adds each further block of eight, itself summed left to
    right, to the running total. The caller orders the columns as
    ``add_n_order``; this function reproduces that association with adds of
    whole column slices (``_column_sum``: the blocks of eight are summed side
    by side, then added to the running total one by one), bit for bit.
    ``reduce_sum`` would not: Eigen reduces an inner axis in SIMD lanes. The
    gradient of every term is the output gradient: a ``Tile`` of it, which
    StitchConcatGrad reads as a column without materialising ``[B, n]``.

    Returns:
        ``[B, 1]`` for a matrix ``x``, else ``[B, ...]`` (axis 1 summed away).
    """
    n = int(x.shape[1])
    head = n % ADD_N_CHUNK
    head = {0: ADD_N_CHUNK, 1: ADD_N_CHUNK + 1}.get(head, head)
    head = min(head, n)
    inner = x.shape.as_list()[2:]
    with tf.name_scope(FUSED_SUM_SCOPE):
        total = _column_sum(x[:, :head], head)  # [B, 1, ...]
        if head < n:
            blocks = (n - head) // ADD_N_CHUNK
            # [B, blocks, 8, ...]: the eight columns of every block summed side by side -> [B, blocks, 1, ...]
            grouped = tf.reshape(x[:, head:], [-1, blocks, ADD_N_CHUNK, *inner])
            block_sums = tf.reshape(_in_order(tf.split(grouped, ADD_N_CHUNK, axis=2)), [-1, blocks, *inner])
            total = _in_order([total, *(tf.split(block_sums, blocks, axis=1) if blocks > 1 else [block_sums])])
        total = tf.reshape(total, [-1, *inner]) if x.shape.rank > 2 else total

    def grad(dy):  # a Tile, as reduce_sum's gradient: StitchConcatGrad reads its [B, 1] source
        multiples = [1, n] + [1] * (x.shape.rank - 2)
        return tf.tile(dy if x.shape.rank == 2 else tf.expand_dims(dy, 1), multiples)

    return total, grad

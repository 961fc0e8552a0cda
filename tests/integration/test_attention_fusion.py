"""DIN's attention input ``[q, k, q - k, q * k] @ W`` computed from the query once per example (attention_fusion).

A graph-level test of the rule (``dataflow_fusion.fusing`` around the ops, as an optimized model's forward pass
runs it): the repeated query (Keras ``repeat_elements``, i.e. a ``ConcatV2`` of copies; a ``Tile``; or a
``BroadcastTo`` to the keys' shape with a dynamic sequence length, as ``hybridtf.models``' DIN writes it), the
concatenation and the product become one product of the 3d-wide ``[k, q - k, q * k]`` and one of the query;
the values and every gradient equal the unfused ones (1e-5 relative); the query's copies and the 4d-wide
concatenation are no longer computed. Shapes that are not DIN's attention input keep their ``MatMul``.
End to end, DeepCTR DIN (``tests/integration/test_deepctr.py``) trains within 1e-5 of its plain model with the rule.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hybridtf._src.rewrite import dataflow_fusion

B, T, D, UNITS = 8, 5, 4, 6


def _live_ops(graph: tf.Graph) -> list[tf.Operation]:
    """The ops of ``graph`` its outputs need (TensorFlow prunes the others before running)."""
    stack, seen = [t.op for t in graph.outputs], {}
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen[op.name] = op
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return list(seen.values())


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = tf.constant(rng.standard_normal((B, 1, D)), tf.float32)
    k = tf.constant(rng.standard_normal((B, T, D)), tf.float32)
    w = tf.constant(rng.standard_normal((4 * D, UNITS)), tf.float32)
    return q, k, w


def _repeat(q, how, k):
    if how == "repeat_elements":
        return tf.keras.backend.repeat_elements(q, T, 1)
    if how == "broadcast_to":  # hybridtf.models' DIN: the query broadcast to the keys' (dynamic) shape
        return tf.broadcast_to(q, tf.shape(k))
    return tf.tile(q, [1, T, 1])


def _step(fuse: bool, how: str = "repeat_elements", order=("q", "k", "d", "p")):
    """(y, dy/dq, dy/dk, dy/dw, fused attention names, op types of the graph) of one traced product."""
    found = {}

    spec = [tf.TensorSpec([None, 1, D]), tf.TensorSpec([None, None if how == "broadcast_to" else T, D])]
    spec += [tf.TensorSpec([4 * D, UNITS]), tf.TensorSpec([None, None, UNITS])]

    @tf.function(autograph=False, input_signature=spec)
    def run(q, k, w, g):
        with tf.GradientTape() as tape:
            tape.watch([q, k, w])
            ctx = dataflow_fusion.fusing(enabled=fuse)
            with ctx as scope:
                queries = _repeat(q, how, k)
                pieces = {"q": queries, "k": k, "d": queries - k, "p": queries * k}
                x = tf.concat([pieces[n] for n in order], axis=-1)
                y = tf.reshape(tf.matmul(tf.reshape(x, [-1, 4 * D]), w), tf.concat([tf.shape(k)[:2], [UNITS]], 0))
            loss = tf.reduce_sum(y * g)  # a fixed output gradient
        found["attention"] = list(scope.log.attention) if scope is not None else []
        return (y, *tape.gradient(loss, [q, k, w]))

    q, k, w = _inputs()
    g = tf.constant(np.random.default_rng(1).standard_normal((B, T, UNITS)), tf.float32)
    out = run(q, k, w, g)
    graph = run.get_concrete_function().graph
    return [t.numpy() for t in out], found["attention"], graph


@pytest.mark.parametrize("how", ["repeat_elements", "tile", "broadcast_to"])
def test_fused_product_and_gradients_equal_the_plain_ones(how):
    plain, plain_log, _ = _step(False, how)
    fused, log, graph = _step(True, how)
    assert plain_log == [] and len(log) == 1
    for got, want in zip(fused, plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # what runs (the ops the outputs need): no MatMul of the 4d-wide input, no copies of the query
    live = _live_ops(graph)
    widths = [op.inputs[0].shape[-1] for op in live if op.type == "MatMul"]
    assert 4 * D not in widths and 3 * D in widths and D in widths
    forward = [op for op in live if not op.name.startswith("gradient_tape")]
    assert not [op for op in forward if op.type == "Tile" or (op.type == "ConcatV2" and len(op.inputs) > 4)]


@pytest.mark.parametrize("order", [("k", "q", "d", "p"), ("q", "k", "p", "d")])
def test_other_layouts_keep_their_matmul(order):
    plain, _, _ = _step(False, order=order)
    fused, log, _ = _step(True, order=order)
    assert log == []
    for got, want in zip(fused, plain):
        np.testing.assert_array_equal(got, want)

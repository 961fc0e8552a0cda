"""The FM fusion follows the dataflow: a hand-written factorization machine gets one StitchFM and trains exactly.

A Keras functional model written without DeepCTR: its fields are stacked with ``tf.stack`` (not a concat), the FM
cross term uses ``tf.square(x)`` for the sum of squares and no ``keepdims``; an MLP on the flattened fields and a
linear part complete a DeepFM. Per-step losses over 100 steps stay within 1e-5 relative of the plain model with
Adagrad and Adam; the training step runs one StitchFM and no per-field stack of the FM's input.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from tests.integration.step_ops import graph_pruned_op_types, step_graph

VOCABS = [50, 80, 120, 30, 60, 200, 90]
DIM = 4
STEPS = 100
BATCH = 64


def _fm(stacked, style):
    """The cross term ``0.5 * sum_d((sum_f e)^2 - sum_f e^2)``, written two ways."""
    if style == "square":
        square_of_sum = tf.square(tf.reduce_sum(stacked, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(stacked), axis=-2)
    else:
        summed = tf.reduce_sum(stacked, axis=1, keepdims=True)
        square_of_sum = summed * summed
        sum_of_square = tf.reduce_sum(stacked * stacked, axis=1, keepdims=True)
        square_of_sum = tf.squeeze(square_of_sum, 1)
        sum_of_square = tf.squeeze(sum_of_square, 1)
    return 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1, keepdims=True)


class FMLayer(tf.keras.layers.Layer):
    """A user's own FM layer (not DeepCTR's class)."""

    def __init__(self, style="square", **kwargs):
        super().__init__(**kwargs)
        self.style = style

    def call(self, fields):
        return _fm(tf.stack(fields, axis=1), self.style)


def _model(style, seed=3):
    tf.keras.utils.set_random_seed(seed)
    inputs = {f"f{i}": tf.keras.Input(shape=(), dtype=tf.int64, name=f"f{i}") for i in range(len(VOCABS))}
    fields = [tf.keras.layers.Embedding(v, DIM, name=f"emb{i}")(inputs[f"f{i}"]) for i, v in enumerate(VOCABS)]
    wide = [tf.keras.layers.Embedding(v, 1, name=f"wide{i}")(inputs[f"f{i}"]) for i, v in enumerate(VOCABS)]
    fm = FMLayer(style, name="my_fm")(fields)
    deep = tf.keras.layers.Concatenate()(fields)
    deep = tf.keras.layers.Dense(16, activation="relu")(deep)
    logit = tf.keras.layers.Dense(1)(deep) + fm + tf.keras.layers.Add()(wide)
    return tf.keras.Model(inputs, tf.keras.layers.Activation("sigmoid")(logit))


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        x = {f"f{i}": tf.constant(rng.zipf(1.3, BATCH).clip(1, v) - 1) for i, v in enumerate(VOCABS)}
        out.append((x, tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32))))
    return out


def _train(model, optimizer, batches):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


CASES = [
    pytest.param("square", "adagrad", STEPS, id="square-adagrad"),
    pytest.param("square", "adam", STEPS, id="square-adam", marks=[pytest.mark.slow]),
    pytest.param("mul_keepdims", "adagrad", 30, id="mul_keepdims-adagrad"),
]


@pytest.mark.parametrize(("style", "opt", "steps"), CASES)
def test_hand_written_fm_is_fused_and_trains_exactly(style, opt, steps):
    batches = _batches()[:steps]
    plain, fused = _model(style), htf.keras.optimize(_model(style))
    make = {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.05), "adam": lambda: tf.keras.optimizers.Adam(0.01)}
    expected = _train(plain, make[opt](), batches)
    np.testing.assert_allclose(_train(fused, make[opt](), batches), expected, rtol=1e-5, atol=0)
    assert fused.hybridtf_fused_fm == ["my_fm"]
    types = graph_pruned_op_types(step_graph(fused, batches[:1]))
    assert types.count("HybridTF>StitchFM") == 1 and types.count("HybridTF>StitchFMGrad") == 1
    # the FM's stack is never written: the only StitchConcat left is the wide sum's
    assert types.count("HybridTF>StitchConcat") == 1
    assert "Pack" not in types


def test_fm_fusion_leaves_other_differences_alone():
    """A ``Sub`` that is not an FM cross term (sum of squares over the dim axis) keeps the user's ops."""
    batches = _batches()[:10]

    class NotFM(tf.keras.layers.Layer):
        def call(self, fields):
            x = tf.stack(fields, axis=1)
            return tf.reduce_sum(tf.square(tf.reduce_sum(x, 1)) - tf.reduce_sum(tf.square(x), 2), 1, keepdims=True)

    def build():
        tf.keras.utils.set_random_seed(4)
        inputs = {f"f{i}": tf.keras.Input(shape=(), dtype=tf.int64, name=f"f{i}") for i in range(4)}
        fields = [tf.keras.layers.Embedding(VOCABS[i], DIM)(inputs[f"f{i}"]) for i in range(4)]
        return tf.keras.Model(inputs, tf.sigmoid(NotFM()(fields)))

    plain, fused = build(), htf.keras.optimize(build())
    batches = [({k: v for k, v in x.items() if int(k[1:]) < 4}, y) for x, y in batches]
    np.testing.assert_allclose(
        _train(fused, tf.keras.optimizers.Adagrad(0.05), batches),
        _train(plain, tf.keras.optimizers.Adagrad(0.05), batches),
        rtol=1e-5,
        atol=0,
    )
    assert fused.hybridtf_fused_fm == []

"""Ops the dataflow fusions leave alone come out of the rewrite exactly as TensorFlow builds them.

The fusions run as an op callback around the optimized model's forward pass. TensorFlow hands an op
callback ``tuple(op.outputs)`` and the op's Python caller receives what the callback returns, so a
callback that handed the tuple back turned ``tf.unstack``'s list into a tuple. Keras' unrolled
backward RNN reverses that list in place (``inputs.reverse()``): DeepCTR's DSIN (a BiLSTM over
session embeddings) failed to train once optimized. Here the same structure, written by hand, must
train exactly like the plain model. So must a model whose layers add losses during the step
(activity regularizers, ``add_loss`` in ``call``): the record pass that finds the lookups must not
leave its scratch-graph losses in the layers (they failed the step as inaccessible tensors).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import hybridtf as htf

VOCABS = (40, 60, 30)
BATCH = 16


def _model():
    tf.keras.utils.set_random_seed(3)
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(len(VOCABS))]
    rows = [tf.keras.layers.Embedding(v, 4, name=f"emb{i}")(x) for i, (v, x) in enumerate(zip(VOCABS, inputs))]
    seq = tf.keras.layers.Concatenate(axis=1)(rows)  # [B, fields, 4]: the fields as time steps
    backward = tf.keras.layers.LSTM(5, go_backwards=True, unroll=True, return_sequences=True)(seq)
    pooled = tf.keras.layers.Flatten()(backward)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(pooled)
    return tf.keras.Model(inputs, out)


def _batches(steps):
    rng = np.random.default_rng(0)
    return [
        (
            {f"f{i}": tf.constant(rng.integers(0, v, (BATCH, 1))) for i, v in enumerate(VOCABS)},
            tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32)),
        )
        for _ in range(steps)
    ]


def _train(model, batches):
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


def test_unrolled_backward_rnn_over_packed_fields_trains_exactly():
    batches = _batches(8)
    plain, packed = _model(), _model()
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    assert packed.hybridtf_skipped == []
    assert {m.name for pt in packed.hybridtf_plan.packed_tables for m in pt.members} == {"emb0", "emb1", "emb2"}
    np.testing.assert_allclose(_train(packed, batches), _train(plain, batches), rtol=1e-5, atol=0)


def test_callback_returns_the_ops_outputs_as_a_list():
    from hybridtf._src.rewrite.dataflow_fusion import fusing

    with tf.Graph().as_default():
        x = tf.zeros([3, 2])
        with fusing() as scope:
            assert scope is not None
            parts = tf.unstack(x)
            parts.reverse()  # a list, as without the callback
        assert isinstance(parts, list) and len(parts) == 3


class _AuxLoss(tf.keras.layers.Layer):
    def call(self, x):
        self.add_loss(0.01 * tf.reduce_mean(tf.square(x)))
        return x


def _regularized_model():
    tf.keras.utils.set_random_seed(4)
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(len(VOCABS))]
    rows = [
        tf.keras.layers.Embedding(v, 4, activity_regularizer="l2" if i == 0 else None, name=f"emb{i}")(x)
        for i, (v, x) in enumerate(zip(VOCABS, inputs))
    ]
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(r) for r in rows])
    h = tf.keras.layers.Dense(6, activation="relu", activity_regularizer="l1")(_AuxLoss()(h))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(h))


def test_activity_regularizers_and_add_loss_in_call_train_exactly():
    batches = _batches(6)
    plain, packed = _regularized_model(), _regularized_model()
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    assert len(packed.hybridtf_plan.packed_tables) == 1
    np.testing.assert_allclose(_train(packed, batches), _train(plain, batches), rtol=1e-5, atol=0)

"""Subclasses of Keras's Embedding with a call() of their own: packed, and their call runs as written.

The capture replaces only ``Embedding.call`` (the lookup): a subclass's ``super().call(ids)`` is the packed
lookup, and whatever the subclass does around it (scaling, id remapping, a ``training`` argument) stays. A subclass
that looks its table up itself, without ``Embedding.call``, is left unpacked with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

VOCAB, DIM, LEN, BATCH, STEPS = 60, 4, 3, 32, 20


class ScaledEmbedding(tf.keras.layers.Embedding):
    """Transformer-style: rows times sqrt(dim)."""

    def call(self, inputs):
        return super().call(inputs) * tf.sqrt(float(self.output_dim))


class OovEmbedding(tf.keras.layers.Embedding):
    """Ids outside the vocabulary map to its last row (they fail in a plain Embedding)."""

    def call(self, inputs):
        oov = tf.cast(self.input_dim - 1, inputs.dtype)
        return super().call(tf.where((inputs < 0) | (inputs >= self.input_dim), oov, inputs))


class TrainingEmbedding(tf.keras.layers.Embedding):
    """A call with a ``training`` argument (Keras passes it)."""

    def call(self, inputs, training=None):
        out = super().call(inputs)
        return out * 0.5 if training else out


class OwnLookupEmbedding(tf.keras.layers.Embedding):
    """Looks the table up itself: hybridtf cannot serve that lookup."""

    def call(self, inputs):
        return tf.nn.embedding_lookup(self.embeddings, inputs) * 2.0


def build(cls, seed=0):
    tf.keras.utils.set_random_seed(seed)
    a = tf.keras.Input((LEN,), dtype=tf.int64, name="a")
    b = tf.keras.Input((1,), dtype=tf.int64, name="b")
    emb_a = cls(VOCAB, DIM, name="emb_a")(a)
    emb_b = tf.keras.layers.Embedding(VOCAB, DIM, name="emb_b")(b)
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb_a), tf.keras.layers.Flatten()(emb_b)])
    x = tf.keras.layers.Dense(8, activation="relu")(x)
    return tf.keras.Model([a, b], tf.keras.layers.Dense(1, activation="sigmoid")(x))


def data(seed=1, oov=False):
    rng = np.random.default_rng(seed)
    high = VOCAB + 20 if oov else VOCAB
    xa = rng.integers(0, high, size=(BATCH * STEPS, LEN)).astype(np.int64)
    xb = rng.integers(0, VOCAB, size=(BATCH * STEPS, 1)).astype(np.int64)
    y = (rng.random((BATCH * STEPS, 1)) < 0.5).astype(np.float32)
    return [xa, xb], y


class Losses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(logs["loss"])


def train(model, optimizer, x, y):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    cb = Losses()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    return np.array(cb.values)


@pytest.mark.parametrize("cls", [ScaledEmbedding, OovEmbedding, TrainingEmbedding], ids=lambda c: c.__name__)
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_subclass_call_runs_and_trains_as_plain(cls, optimizer):
    x, y = data(oov=cls is OovEmbedding)
    plain = build(cls)
    optimized = htf.keras.optimize(build(cls))
    assert optimized.hybridtf_skipped == []
    assert sorted(m.name for pt in optimized.hybridtf_plan.packed_tables for m in pt.members) == ["emb_a", "emb_b"]
    np.testing.assert_allclose(optimized.predict(x, verbose=0), plain.predict(x, verbose=0), rtol=1e-6, atol=1e-7)
    expected = train(plain, optimizer, x, y)
    got = train(optimized, optimizer, x, y)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(optimized(x, training=True), plain(x, training=True), rtol=1e-5, atol=1e-6)


def test_subclass_weights_round_trip(tmp_path):
    x, y = data()
    optimized = htf.keras.optimize(build(ScaledEmbedding))
    train(optimized, "adagrad", x, y)
    optimized.save_weights(str(tmp_path / "ckpt"))
    fresh = htf.keras.optimize(build(ScaledEmbedding, seed=5))
    fresh.load_weights(str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(fresh.predict(x, verbose=0), optimized.predict(x, verbose=0))


def test_subclass_with_its_own_lookup_stays_unpacked_with_the_reason():
    x, y = data()
    plain = build(OwnLookupEmbedding)
    optimized = htf.keras.optimize(build(OwnLookupEmbedding))
    skipped = {s.name: s.reason for s in optimized.hybridtf_skipped}
    assert list(skipped) == ["emb_a"]
    assert "OwnLookupEmbedding overrides call()" in skipped["emb_a"] and "super().call(ids)" in skipped["emb_a"]
    np.testing.assert_allclose(train(optimized, "adagrad", x, y), train(plain, "adagrad", x, y), rtol=1e-5)

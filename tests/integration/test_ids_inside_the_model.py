"""Ids a model computes itself from raw features: recorded in the step's own mode, each op run once.

An optimized model computes the ids of all its lookups before its forward pass. When the model
makes its ids (``StringLookup``, ``Discretization``, a custom layer), they are recorded in a scratch
graph in the step's mode and copied into the step. So a layer that acts differently in training
(BatchNormalization before a ``Discretization``) gives the ids the plain step uses, a counter on the
id path counts once per step, and ids drawn through random ops (id dropout) are refused with the fix
instead of being drawn apart from the plain model's.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.context import CaptureError

BATCH, STEPS = 32, 6
WORDS = [f"w{i}" for i in range(20)]


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        x = {
            "word": tf.constant(rng.choice([*WORDS, "oov"], (BATCH, 1))),
            "price": tf.constant(rng.normal(2.0, 3.0, (BATCH, 1)).astype(np.float32)),
        }
        out.append((x, tf.constant((rng.random((BATCH, 1)) < 0.3).astype(np.float32))))
    return out


class Counter(tf.keras.layers.Layer):
    """Counts the examples it sees (a frequency statistic updated on the id path)."""

    def build(self, input_shape):
        self.seen = self.add_weight("seen", (), tf.int64, initializer="zeros", trainable=False)

    def call(self, ids):
        self.seen.assign_add(tf.cast(tf.shape(ids)[0], tf.int64))
        return ids


class IdDropout(tf.keras.layers.Layer):
    def call(self, ids, training=None):
        if training:
            return tf.where(tf.random.uniform(tf.shape(ids), seed=1) >= 0.5, ids, tf.zeros_like(ids))
        return ids


def _model(kind="bn", head_dropout=False):
    tf.keras.utils.set_random_seed(4)
    word = tf.keras.Input((1,), dtype=tf.string, name="word")
    price = tf.keras.Input((1,), name="price")
    ids = tf.keras.layers.StringLookup(vocabulary=WORDS, name="lookup")(word)
    ids = IdDropout(name="id_dropout")(ids) if kind == "dropout" else Counter(name="counter")(ids)
    scaled = price
    if kind != "counter":  # batch statistics in training, moving ones at inference
        scaled = tf.keras.layers.BatchNormalization(name="bn")(price)
    bucket = tf.keras.layers.Discretization(bin_boundaries=[-1.0, 0.0, 1.0, 2.0], name="bucket")(scaled)
    emb_word = tf.keras.layers.Embedding(len(WORDS) + 1, 4, name="emb_word")(ids)
    emb_price = tf.keras.layers.Embedding(5, 4, name="emb_price")(bucket)
    flat = [tf.keras.layers.Flatten()(emb_word), tf.keras.layers.Flatten()(emb_price)]
    x = tf.keras.layers.Concatenate(name="features")(flat)
    if head_dropout:  # a seeded Dropout moves its seed per call: the recording pass must not move it
        x = tf.keras.layers.Dropout(0.3, seed=7)(x)
    out = tf.keras.layers.Dense(1, "sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(2))(x)
    return tf.keras.Model({"word": word, "price": price}, out)


def test_ids_computed_in_training_mode_and_stateful_id_path_runs_once():
    batches = _batches()
    plain, packed = _model(), _model()
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    assert packed.hybridtf_skipped == []
    assert {m.name for pt in packed.hybridtf_plan.packed_tables for m in pt.members} == {"emb_word", "emb_price"}
    losses = []
    for model in (plain, packed):
        model.compile(tf.keras.optimizers.Adam(0.05), "binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)
    for model in (plain, packed):  # BatchNormalization's moving statistics updated once per step, the counter too
        assert int(model.get_layer("counter").seen.numpy()) == STEPS * BATCH
    np.testing.assert_allclose(
        packed.get_layer("bn").moving_mean.numpy(), plain.get_layer("bn").moving_mean.numpy(), rtol=1e-6
    )
    x = batches[0][0]
    np.testing.assert_allclose(packed.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-7)
    assert int(packed.get_layer("counter").seen.numpy()) == (STEPS + 1) * BATCH


def test_ids_drawn_through_random_ops_are_refused_with_the_fix():
    model = htf.keras.optimize(_model("dropout"))
    model.compile(tf.keras.optimizers.Adagrad(0.1), "binary_crossentropy")
    x, y = _batches()[0]
    with pytest.raises(CaptureError, match=r"'emb_word'.*random op.*input pipeline.*exclude=\['emb_word'\]"):
        model.train_on_batch(x, y)
    model = htf.keras.optimize(_model("dropout"), exclude=["emb_word"])  # the fix: that table stays plain
    model.compile(tf.keras.optimizers.Adagrad(0.1), "binary_crossentropy")
    assert np.isfinite(model.train_on_batch(x, y))
    assert np.isfinite(model.predict_on_batch(x)).all()  # inference: no dropout, packed as usual


@pytest.mark.parametrize("interleave_from", ["features", "mlp", "mlp_fused"])
def test_micro_batches_from_a_layer_with_ids_computed_inside(interleave_from):
    """The lookups (the head up to ``features``) run once on the whole batch: ids recorded in training mode."""
    batches = _batches()
    plain, packed = _model("counter"), _model("counter")
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed, micro_batches=2, interleave_from=interleave_from)
    losses = []
    for model in (plain, packed):
        model.compile(tf.keras.optimizers.Adagrad(0.1), "binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)
    assert int(packed.get_layer("counter").seen.numpy()) == int(plain.get_layer("counter").seen.numpy())


def test_a_seeded_dropout_after_the_lookups_draws_as_in_the_plain_model():
    batches = _batches()
    plain, packed = _model("counter", head_dropout=True), _model("counter", head_dropout=True)
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    losses = []
    for model in (plain, packed):
        model.compile(tf.keras.optimizers.Adagrad(0.1), "binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)


def _noted(caplog, text):
    return [r for r in caplog.records if r.name == "hybridtf" and text in r.getMessage()]


def test_eager_steps_warn_once_that_computed_ids_are_recorded_in_inference_mode(caplog):
    model = htf.keras.optimize(_model("counter"))
    model.compile(optimizer="adagrad", loss="binary_crossentropy", run_eagerly=True)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model(_batches()[0][0])  # an eager inference call: exact, nothing to say
        assert not _noted(caplog, "eagerly")
        for x, y in _batches()[:2]:
            model.train_on_batch(x, y)
    [record] = _noted(caplog, "is called eagerly in training mode")
    assert "Run the steps as a graph" in record.getMessage()


class PyIds(tf.keras.layers.Layer):
    """Ids through a tf.py_function (an op with side effects on the id path)."""

    def call(self, ids):
        out = tf.py_function(lambda t: t, [ids], ids.dtype)
        out.set_shape(ids.shape)
        return out


def test_ids_through_an_op_with_side_effects_warn_and_train_as_the_plain_model(caplog):
    def build():
        tf.keras.utils.set_random_seed(5)
        word = tf.keras.Input((1,), dtype=tf.string, name="word")
        ids = PyIds()(tf.keras.layers.StringLookup(vocabulary=WORDS)(word))
        emb = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(len(WORDS) + 1, 4, name="emb_word")(ids))
        model = tf.keras.Model({"word": word}, tf.keras.layers.Dense(1, "sigmoid")(emb))
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        return model

    plain, optimized = build(), build()
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        optimized = htf.keras.optimize(optimized)
        for x, y in _batches():
            words = {"word": x["word"]}
            np.testing.assert_allclose(optimized.train_on_batch(words, y), plain.train_on_batch(words, y), rtol=1e-5)
    [record] = _noted(caplog, "which has side effects")
    assert "emb_word" in record.getMessage() and "EagerPyFunc" in record.getMessage()


def test_lookups_of_ids_computed_inside_keep_their_static_shape():
    """StringLookup sets its output's shape in Python (set_shape), which copying its ops into the step loses:
    an op after the lookup that needs the rank (a softmax over the sequence axis) failed on an unknown shape."""

    def build():
        tf.keras.utils.set_random_seed(6)
        words = tf.keras.Input((6,), dtype=tf.string, name="words")
        ids = tf.keras.layers.StringLookup(vocabulary=WORDS, name="lookup")(words)
        emb = tf.keras.layers.Embedding(len(WORDS) + 1, 4, name="emb")(ids)  # [batch, 6, 4]
        attended = tf.nn.softmax(emb, axis=1)
        return tf.keras.Model(words, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(attended)))

    plain, packed = build(), htf.keras.optimize(build())
    assert [m.name for pt in packed.hybridtf_plan.packed_tables for m in pt.members] == ["emb"]
    rng = np.random.default_rng(1)
    x = tf.constant(rng.choice([*WORDS, "oov"], (BATCH, 6)))
    y = tf.constant(rng.normal(size=(BATCH, 1)).astype(np.float32))
    np.testing.assert_allclose(packed.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-6)
    for model in (plain, packed):
        model.compile(tf.keras.optimizers.Adagrad(0.1), "mse")
    for _ in range(3):
        np.testing.assert_allclose(packed.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-5)


@pytest.mark.parametrize("vocabulary", ["adapt", "set_vocabulary"])
def test_an_adapted_lookup_layer_packs_and_trains_exactly(vocabulary, tmp_path):
    """A ``StringLookup`` adapted (or given its vocabulary after it was made) lists a ``VocabWeightHandler``
    among the model's weights, without a name or a shape: ``optimize`` failed with AttributeError (found by a
    probe). Its tables pack and train exactly, and the model saves and loads."""

    def build():
        tf.keras.utils.set_random_seed(6)
        lookup = tf.keras.layers.StringLookup(name="lookup")
        if vocabulary == "adapt":
            lookup.adapt(tf.constant([[w] for w in WORDS]))
        else:
            lookup.set_vocabulary(WORDS)
        word = tf.keras.Input((1,), dtype=tf.string, name="word")
        emb = tf.keras.layers.Embedding(lookup.vocabulary_size(), 4, name="emb_word")(lookup(word))
        out = tf.keras.layers.Dense(1, "sigmoid")(tf.keras.layers.Flatten()(emb))
        model = tf.keras.Model({"word": word}, out)
        return model

    batches = [({"word": x["word"]}, y) for x, y in _batches(seed=3)]
    plain, optimized = build(), htf.keras.optimize(build())
    assert optimized.hybridtf_skipped == [] and len(optimized.hybridtf_plan.packed_tables) == 1
    losses = []
    for model in (plain, optimized):
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    optimized.save_weights(str(tmp_path / "w"))
    restored = htf.keras.optimize(build())
    restored.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    restored.load_weights(str(tmp_path / "w"))
    x = batches[0][0]
    np.testing.assert_array_equal(restored.predict_on_batch(x), optimized.predict_on_batch(x))

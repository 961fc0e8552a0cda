"""hybridtf.keras.optimize: what it packs, what it skips and why, errors, memory, decorator use."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.keras_capture import is_captured


def _model(extra_layers=()):
    ids = {name: tf.keras.Input(shape=(), dtype=tf.int64, name=name) for name in ("a", "b", "c", "d")}
    layers = {
        "a": tf.keras.layers.Embedding(50, 4, name="emb_a"),
        "b": tf.keras.layers.Embedding(60, 4, name="emb_b"),
        "c": tf.keras.layers.Embedding(70, 8, name="emb_c"),
        "d": tf.keras.layers.Embedding(80, 4, name="emb_d", embeddings_regularizer=lambda w: 0.01 * tf.reduce_sum(w)),
    }
    embs = [tf.keras.layers.Flatten()(layers[k](ids[k])) for k in ids]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(embs))
    return tf.keras.Model(ids, out)


def _batch(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return {k: tf.constant(rng.integers(0, 50, size=n)) for k in "abcd"}


def test_unsupported_layers_are_skipped_with_reasons_and_the_rest_packed():
    model = htf.keras.optimize(_model())
    skipped = {s.name: s.reason for s in model.hybridtf_skipped}
    assert list(skipped) == ["emb_d"] and "has no gradient formula hybridtf can fold" in skipped["emb_d"]
    plan = model.hybridtf_plan
    packed = {m.name for pt in plan.packed_tables for m in pt.members}
    assert packed == {"emb_a", "emb_b", "emb_c"}
    assert {pt.dim for pt in plan.packed_tables} == {4, 8}  # D-packing by dim
    assert not is_captured(model.get_layer("emb_d"))
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(_batch(), tf.ones([16, 1]), verbose=0)  # the skipped layer still trains as plain Keras


def test_out_of_vocabulary_id_names_the_table_in_packed_and_direct_paths():
    model = htf.keras.optimize(_model())
    bad = _batch()
    bad["b"] = tf.constant([3] * 15 + [600], tf.int64)
    message = r"embedding table 'emb_b' got id 600 \(flat position 15 of its ids\), outside its vocabulary \[0, 60\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.predict_on_batch(bad)  # packed path (tf.function)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.get_layer("emb_b")(bad["b"])  # the layer on its own: the direct path


def test_invalid_plan_overrides_name_the_table_or_group():
    with pytest.raises(ValueError, match="emb_zz"):
        htf.keras.optimize(_model(), exclude=["emb_zz"])
    with pytest.raises(ValueError, match=r"mix"):
        htf.keras.optimize(_model(), force_groups={"g": ["emb_a", "emb_c"]})  # dims 4 and 8


def test_excluded_tables_stay_plain_and_exactness_holds():
    plain, wrapped = _model(), _model()
    wrapped.set_weights(plain.get_weights())
    wrapped = htf.keras.optimize(wrapped, exclude=["emb_a"])
    assert "emb_a" in {s.name for s in wrapped.hybridtf_skipped}
    assert not is_captured(wrapped.get_layer("emb_a"))
    for m in (plain, wrapped):
        m.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    for step in range(5):
        x, y = _batch(seed=step), tf.constant(np.random.default_rng(step).integers(0, 2, (16, 1)), tf.float32)
        np.testing.assert_allclose(wrapped.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-5)


def test_original_table_variables_are_released():
    model = _model()
    refs = [weakref.ref(model.get_layer(n).embeddings) for n in ("emb_a", "emb_b", "emb_c")]
    model = htf.keras.optimize(model)
    gc.collect()
    assert all(r() is None for r in refs), "optimize() must not keep the per-table variables alive"


def test_decorator_and_idempotence():
    @htf.keras.optimize
    def build():
        return _model()

    model = build()
    assert htf.keras.is_optimized(model)
    assert htf.keras.optimize(model) is model


def test_wrapping_a_trained_model_changes_no_prediction():
    model = _model()
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(_batch(), tf.ones([16, 1]), verbose=0, epochs=3)
    x = _batch(seed=5)
    before = model.predict_on_batch(x)
    model = htf.keras.optimize(model)
    np.testing.assert_allclose(model.predict_on_batch(x), before, rtol=1e-6, atol=1e-7)


class _Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.emb = tf.keras.layers.Embedding(10, 2)
        self.out = tf.keras.layers.Dense(1)

    def call(self, ids):
        return self.out(self.emb(ids))


def test_unbuilt_model_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a built model"):
        htf.keras.optimize(_Subclassed())
    model = _Subclassed()
    model(tf.constant([1, 2]))
    assert htf.keras.is_optimized(htf.keras.optimize(model))

"""A model built from an optimized model's Embedding layers (transfer learning: a new head on A's tables).

The packed layers' tables live in A's packed variable, which a second, plain model B does not hold: its
``fit`` trained the head and left the tables untouched, silently (found by a probe; the plain workflow
trains them). It is now refused with the fix. Optimizing B as well packed the layers again into B's
variables: A then predicted with B's tables but never trained them, and B's ``save_weights`` missed them
(a second probe); that ``optimize`` is refused too. The fix the errors give — rebuild A's layers plain
(``clone_model`` + ``set_weights``) and optimize B built on them — trains as the plain workflow does, and
B with the layers frozen trains its head alone.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.outside_calls import OutsideTrainingError
from hybridtf._src.integrations.keras_notices import SharedPackedLayersError

FIELDS, VOCAB = 6, 300


def model_a():
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((FIELDS,), dtype=tf.int64, name="x")
    embs = [tf.keras.layers.Embedding(VOCAB, 8, name=f"emb{i}")(inp[:, i : i + 1]) for i in range(FIELDS)]
    h = tf.keras.layers.Flatten()(tf.keras.layers.Concatenate(axis=1)(embs))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1, activation="sigmoid", name="a_out")(h))


def model_b(a):
    """A new head on A's embedding layers (the same layer objects)."""
    tf.keras.utils.set_random_seed(5)
    inp = tf.keras.Input((FIELDS,), dtype=tf.int64, name="xb")
    embs = [a.get_layer(f"emb{i}")(inp[:, i : i + 1]) for i in range(FIELDS)]
    h = tf.keras.layers.Flatten()(tf.keras.layers.Concatenate(axis=1)(embs))
    h = tf.keras.layers.Dense(16, activation="relu", name="b_hidden")(h)
    return tf.keras.Model(inp, tf.keras.layers.Dense(1, activation="sigmoid", name="b_out")(h))


def data():
    rng = np.random.default_rng(3)
    return rng.integers(0, VOCAB, (512, FIELDS)), rng.integers(0, 2, (512, 1)).astype(np.float32)


def workflow(optimize_a: bool, optimize_b: bool, freeze: bool = False, rebuild: bool = False):
    """Train A, build B on A's layers, train B: B's losses, A's first table after B's fit, B, and that table
    after A's fit."""
    x, y = data()
    a = model_a()
    if optimize_a:
        a = htf.keras.optimize(a)
    a.compile(tf.keras.optimizers.Adagrad(0.05), "binary_crossentropy")
    a.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    trained_by_a = a.get_layer("emb0").embeddings.numpy()
    if rebuild:  # the fix: A's layers rebuilt plain, with A's trained weights
        copy = tf.keras.models.clone_model(a)
        copy.set_weights(a.get_weights())
        a = copy
    b = model_b(a)
    if freeze:
        for i in range(FIELDS):
            a.get_layer(f"emb{i}").trainable = False
    if optimize_b:
        b = htf.keras.optimize(b)
    b.compile(tf.keras.optimizers.Adam(0.01), "binary_crossentropy")
    history = b.fit(x, y, batch_size=128, epochs=2, shuffle=False, verbose=0)
    return np.array(history.history["loss"]), a.get_layer("emb0").embeddings.numpy(), b, trained_by_a


@pytest.fixture(scope="module")
def plain():
    return workflow(False, False)


def test_a_plain_model_training_an_optimized_models_layers_is_refused_with_the_fix():
    with pytest.raises(OutsideTrainingError, match=r"'emb\d'.*clone_model.*set_weights"):
        workflow(True, False)


def test_optimizing_a_model_that_holds_another_optimized_models_layers_is_refused():
    with pytest.raises(SharedPackedLayersError, match=r"'emb0'.*clone_model.*set_weights"):
        workflow(True, True)


def test_the_fix_trains_the_tables_as_the_plain_workflow(plain, tmp_path):
    losses, table, b, before = workflow(True, True, rebuild=True)
    assert np.abs(table - before).max() > 1e-3  # B trained the table
    np.testing.assert_allclose(losses, plain[0], rtol=1e-5)
    np.testing.assert_allclose(table, plain[1], rtol=1e-5, atol=1e-7)
    b.save_weights(str(tmp_path / "b"))  # B's checkpoint holds the tables it trains
    fresh = model_b(model_a())
    fresh.load_weights(str(tmp_path / "b"))
    x, _ = data()
    np.testing.assert_allclose(fresh.predict(x, verbose=0), b.predict(x, verbose=0), rtol=1e-6)


def test_frozen_layers_leave_the_second_model_training_its_head_alone():
    losses, table, b, before = workflow(True, False, freeze=True)
    reference = workflow(False, False, freeze=True)
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    np.testing.assert_array_equal(table, before)  # B trained its head alone
    np.testing.assert_allclose(table, reference[1], rtol=1e-5, atol=1e-7)
    x, _ = data()
    np.testing.assert_allclose(b.predict(x, verbose=0), reference[2].predict(x, verbose=0), rtol=1e-5)


def test_inference_and_a_custom_loop_outside_the_optimized_model(caplog):
    x, _ = data()
    a = htf.keras.optimize(model_a())
    b = model_b(a)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        b.predict(x, verbose=0)  # no tape: nothing to say
        assert not [r for r in caplog.records if "outside the model that packed" in r.getMessage()]
        variables = htf.keras.layer_variables(a, [a.get_layer(f"emb{i}") for i in range(FIELDS)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(b(x[:8], training=True))
        grads = tape.gradient(loss, variables)  # a custom loop may take the packed variable's gradient
    assert all(g is not None for g in grads)
    [note] = [r for r in caplog.records if "outside the model that packed" in r.getMessage()]
    assert "emb" in note.getMessage() and "layer_variables" in note.getMessage()

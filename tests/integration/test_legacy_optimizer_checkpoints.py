"""``tf.keras.optimizers.legacy`` optimizers: packed tables' slots are checkpointed per table, as the plain model's.

A legacy optimizer saves slots through the object graph (``<table>/.OPTIMIZER_SLOT/optimizer/<slot>``); an
optimized model's graph holds the tables' views, which answer for their rows of the packed slots
(``integrations/keras_legacy_slots.py``). Resuming, plain <-> optimized transfer and optimizing a model whose
optimizer already trained it all continue exactly as the plain model does.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

LEGACY = ("Adam", "Adagrad", "Ftrl")


def _model(optimized, kind):
    tf.keras.utils.set_random_seed(0)
    a, b = tf.keras.Input((1,), dtype="int64"), tf.keras.Input((1,), dtype="int64")
    parts = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 4, name=n)(x)) for n, x in (("ea", a), ("eb", b))]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(parts))
    model = tf.keras.Model([a, b], out)
    if optimized:
        model = htf.keras.optimize(model)
    model.compile(getattr(tf.keras.optimizers.legacy, kind)(0.05), "binary_crossentropy")
    return model


def _batches(n=10):
    rng = np.random.default_rng(0)
    return [
        ([rng.integers(0, 20, (32, 1)), rng.integers(0, 20, (32, 1))], rng.integers(0, 2, (32, 1)).astype("float32"))
        for _ in range(n)
    ]


def _slot_keys(path):
    return sorted(n for n, _ in tf.train.list_variables(path) if "OPTIMIZER_SLOT" in n)


@pytest.mark.parametrize("kind", LEGACY)
@pytest.mark.parametrize(
    "source, target", [(True, True), (False, True), (True, False)], ids=["opt-opt", "plain-opt", "opt-plain"]
)
def test_resumed_training_equals_uninterrupted(kind, source, target, tmp_path):
    batches = _batches()
    model = _model(source, kind)
    for x, y in batches[:5]:
        model.train_on_batch(x, y)
    model.save_weights(str(tmp_path / "ck"))
    expected = [model.train_on_batch(x, y) for x, y in batches[5:]]
    resumed = _model(target, kind)
    resumed.load_weights(str(tmp_path / "ck"))
    np.testing.assert_allclose([resumed.train_on_batch(x, y) for x, y in batches[5:]], expected, rtol=1e-6)


def test_checkpoint_keys_are_the_plain_models(tmp_path):
    keys = []
    for optimized in (False, True):
        model = _model(optimized, "Adam")
        x, y = _batches(1)[0]
        model.train_on_batch(x, y)
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / f"ck{optimized}"))
        keys.append(_slot_keys(str(tmp_path / f"ck{optimized}")))
    assert keys[0] == keys[1] and len(keys[0]) == 2 * 4  # m, v of two tables, the dense kernel and bias


def test_optimizing_a_trained_model_keeps_its_optimizer_state():
    batches = _batches()
    plain, wrapped = _model(False, "Adam"), _model(False, "Adam")
    for x, y in batches[:5]:
        plain.train_on_batch(x, y)
        wrapped.train_on_batch(x, y)
    wrapped = htf.keras.optimize(wrapped)
    wrapped.compile(wrapped.optimizer, "binary_crossentropy")
    expected = [plain.train_on_batch(x, y) for x, y in batches[5:]]
    np.testing.assert_allclose([wrapped.train_on_batch(x, y) for x, y in batches[5:]], expected, rtol=1e-6)

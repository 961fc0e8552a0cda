"""Exactness: an optimized Keras model trains exactly like the plain one.

Same model code, same seeds, same batches: per-step losses over 100 steps agree
within 1e-5 relative (fp32) for W&D, DeepFM, DLRM (functional and subclassed)
and the multi-hot DIN-like model, with Keras SGD, Adagrad and Adam, and with
hybridtf's LazyAdam (plain model with LazyAdam vs the packed model's fused
lazy update). Packed tables are updated by hybridtf's fused sparse ops.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models

STEPS = 100
BATCH = 64


def _fields(kind):
    if kind == "din":
        return ctr_data.din_fields(dim=8, n_users=300, n_items=500, n_cates=50, max_len=6, mean_len=3.0)
    return ctr_data.criteo_like_fields(dim=8, max_vocab=300)[:10]


BUILDERS = {
    "wdl": lambda f, n: ctr_models.wide_and_deep(f, n, hidden=(16, 8), seed=7),
    "deepfm": lambda f, n: ctr_models.deepfm(f, n, hidden=(16, 8), seed=7),
    "dlrm": lambda f, n: ctr_models.dlrm(f, n, hidden=(16, 8), bottom=(8,), seed=7),
    "din": lambda f, n: ctr_models.din_like(f, n, hidden=(16, 8), seed=7),
    "wdl_subclassed": lambda f, n: ctr_models.WideAndDeepModel(f, n, hidden=(16, 8), seed=7),
    "dlrm_subclassed": lambda f, n: ctr_models.DLRMModel(f, n, hidden=(16, 8), bottom=(8,), seed=7),
}
OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    "lazy_adam": lambda: htf.keras.LazyAdam(0.01),
}


def _batches(kind):
    fields = _fields(kind)
    n_dense = 0 if kind == "din" else 4
    batches = ctr_data.generate_batches(fields, n_dense, BATCH, STEPS, seed=11)
    return fields, n_dense, [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in batches]


def _train(model, optimizer, batches):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.fixture(scope="module")
def data():
    return {kind: _batches(kind) for kind in ("criteo", "din")}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", sorted(BUILDERS))
def test_losses_match_plain_model(model_name, optimizer, data):
    fields, n_dense, batches = data["din" if model_name == "din" else "criteo"]
    build = BUILDERS[model_name]
    plain = build(fields, n_dense)
    wrapped = build(fields, n_dense)
    plain(batches[0][0])
    wrapped(batches[0][0])
    wrapped = htf.keras.optimize(wrapped)
    assert htf.keras.is_optimized(wrapped)
    assert wrapped.hybridtf_skipped == []
    plain_losses = _train(plain, OPTIMIZERS[optimizer](), batches)
    wrapped_losses = _train(wrapped, OPTIMIZERS[optimizer](), batches)
    assert np.all(np.isfinite(plain_losses))
    np.testing.assert_allclose(wrapped_losses, plain_losses, rtol=1e-5, atol=0)
    x = batches[-1][0]
    np.testing.assert_allclose(wrapped.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-6)


class _TwoPasses(tf.keras.Model):
    """A consistency loss: the model called twice in one step, so each packed table is looked up twice."""

    def train_step(self, data):
        x, y = data
        shifted = {"a": x["b"] % 20, "b": x["b"]}
        with tf.GradientTape() as tape:
            first, second = self(x, training=True), self(shifted, training=True)
            loss = self.compiled_loss(y, first) + tf.reduce_mean(tf.square(first - second))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        return {"loss": loss}


@pytest.mark.parametrize("name, eager", [("adagrad", False), ("adam", False), ("lazy_adam", False), ("adagrad", True)])
def test_a_step_that_looks_the_tables_up_twice_trains_as_plain(name, eager):
    """The tape joins both lookups' gradients (repeated rows): the fused update sums them as Keras does."""
    L = tf.keras.layers

    def build():
        tf.keras.utils.set_random_seed(0)
        a, b = tf.keras.Input((1,), dtype="int32", name="a"), tf.keras.Input((1,), dtype="int32", name="b")
        e = L.Concatenate()([L.Flatten()(L.Embedding(20, 4)(a)), L.Flatten()(L.Embedding(30, 4)(b))])
        return _TwoPasses({"a": a, "b": b}, L.Dense(1, activation="sigmoid")(L.Dense(8, activation="relu")(e)))

    rng = np.random.default_rng(0)
    x = {"a": rng.integers(0, 20, (64, 1)).astype("int32"), "b": rng.integers(0, 30, (64, 1)).astype("int32")}
    y = rng.integers(0, 2, (64, 1)).astype("float32")
    losses = []
    for optimize in (False, True):
        model = htf.keras.optimize(build()) if optimize else build()
        model.compile(optimizer=OPTIMIZERS[name](), loss="binary_crossentropy", run_eagerly=eager)
        losses.append([model.train_on_batch(x, y) for _ in range(5)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)

"""Optimizer state survives every save format, within and across the plain and optimized layouts.

Train a few steps, save, load into a fresh model (compiled), train 20 more: the losses equal the
uninterrupted run's. Formats: ``save_weights`` (TensorFlow format and ``.weights.h5``), ``.keras``
(``model.save`` + ``load_model``), ``tf.train.Checkpoint`` and ``CheckpointManager``; Adagrad and
Adam (fused on packed tables), RMSprop (Keras's own updates). Within one layout the losses are
equal to 1e-6; across layouts (plain <-> optimized, both ways) to 1e-5, the rewrite's own bound.
State that cannot be carried over raises an ``OptimizerLayoutError`` naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.integrations.keras_slots import OptimizerLayoutError
from hybridtf._src.models import ctr_data, ctr_models

FIELDS = ctr_data.criteo_like_fields(dim=8, max_vocab=200)[:4]
N_DENSE = 3
FIRST, RESUMED = 3, 20
OPTIMIZERS = {
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.01),
}
FORMATS = ("tf", "weights_h5", "keras", "checkpoint", "manager")


@pytest.fixture(scope="module")
def batches():
    raw = ctr_data.generate_batches(FIELDS, N_DENSE, 32, 8, seed=5)
    data = [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in raw]
    return [data[i % len(data)] for i in range(FIRST + RESUMED)]


def _build(batches, wrapped, opt):
    model = ctr_models.wide_and_deep(FIELDS, N_DENSE, hidden=(16, 8), seed=7)
    model({k: tf.zeros_like(v) for k, v in batches[0][0].items()})
    if wrapped:
        model = htf.keras.optimize(model)
    model.compile(optimizer=OPTIMIZERS[opt](), loss="binary_crossentropy")
    return model


def _train(model, batches):
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.fixture(scope="module")
def uninterrupted(batches):
    """``uninterrupted(opt, wrapped)``: the losses of the last RESUMED steps of an uninterrupted run."""
    cache = {}

    def get(opt, wrapped):
        if (opt, wrapped) not in cache:
            cache[opt, wrapped] = _train(_build(batches, wrapped, opt), batches)[FIRST:]
        return cache[opt, wrapped]

    return get


@pytest.fixture(scope="module")
def saved(batches, tmp_path_factory):
    """``saved(opt, wrapped)``: a directory holding a model trained FIRST steps, saved in every format."""
    cache = {}

    def get(opt, wrapped):
        if (opt, wrapped) not in cache:
            path = tmp_path_factory.mktemp(f"{opt}_{'optimized' if wrapped else 'plain'}")
            source = _build(batches, wrapped, opt)
            _train(source, batches[:FIRST])
            source.save_weights(str(path / "ckpt"))
            source.save_weights(str(path / "model.weights.h5"))
            source.save(str(path / "model.keras"))
            tf.train.Checkpoint(model=source, optimizer=source.optimizer).save(str(path / "tfckpt"))
            tf.train.CheckpointManager(tf.train.Checkpoint(model=source), str(path / "managed"), 1).save()
            cache[opt, wrapped] = path
        return cache[opt, wrapped]

    return get


def _load(fmt, path, batches, wrapped, opt):
    """A fresh compiled model (``wrapped`` or plain) loaded from ``path`` in format ``fmt``."""
    if fmt == "keras":
        fresh = tf.keras.models.load_model(str(path / "model.keras"))  # the plain model, compiled
        return htf.keras.optimize(fresh) if wrapped else fresh
    fresh = _build(batches, wrapped, opt)
    if fmt == "tf":
        fresh.load_weights(str(path / "ckpt"))
    elif fmt == "weights_h5":
        if not wrapped:  # plain Keras loads optimizer state from Keras files only into a built optimizer
            fresh.optimizer.build(fresh.trainable_variables)
        fresh.load_weights(str(path / "model.weights.h5"))
    elif fmt == "checkpoint":
        checkpoint = tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer)
        checkpoint.restore(str(path / "tfckpt-1")).assert_nontrivial_match()
    else:
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=fresh), str(path / "managed"), 1)
        assert manager.restore_or_initialize() == str(path / "managed" / "ckpt-1")
    return fresh


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("opt", ["adagrad", "adam"])
def test_resumed_training_equals_uninterrupted(opt, fmt, batches, saved, uninterrupted):
    resumed = _load(fmt, saved(opt, True), batches, True, opt)
    np.testing.assert_allclose(_train(resumed, batches[FIRST:]), uninterrupted(opt, True), rtol=1e-6)


CROSS = [("adagrad", "tf"), ("adagrad", "keras"), ("adagrad", "weights_h5"), ("adam", "tf"), ("adam", "keras")]


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["plain_to_optimized", "optimized_to_plain"])
@pytest.mark.parametrize(("opt", "fmt"), [*CROSS, ("rmsprop", "tf")])
def test_optimizer_state_crosses_layouts(opt, fmt, direction, batches, saved, uninterrupted):
    src_wrapped = direction == "optimized_to_plain"
    resumed = _load(fmt, saved(opt, src_wrapped), batches, not src_wrapped, opt)
    np.testing.assert_allclose(_train(resumed, batches[FIRST:]), uninterrupted(opt, src_wrapped), rtol=1e-5)


@pytest.mark.parametrize("opt", ["adagrad", "adam"])
def test_optimizing_a_trained_model_keeps_its_optimizer_state(opt, batches, uninterrupted):
    model = _build(batches, False, opt)
    _train(model, batches[:FIRST])
    model = htf.keras.optimize(model)  # its built optimizer moves to the packed layout, state included
    np.testing.assert_allclose(_train(model, batches[FIRST:]), uninterrupted(opt, False), rtol=1e-5)


def test_checkpoint_holds_one_slot_per_table_in_the_plain_positions(batches, tmp_path):
    plain, wrapped = _build(batches, False, "adam"), _build(batches, True, "adam")
    for model, name in ((plain, "plain"), (wrapped, "wrapped")):
        _train(model, batches[:1])
        model.save_weights(str(tmp_path / name))
    keys = {name: dict(tf.train.list_variables(str(tmp_path / name))) for name in ("plain", "wrapped")}
    assert keys["plain"] == keys["wrapped"]
    assert not any("_momentums" in k or "_velocities" in k for k in keys["wrapped"])


def test_keras_file_of_another_optimizer_is_refused_not_skipped(batches, tmp_path):
    source = _build(batches, True, "adam")
    _train(source, batches[:1])
    source.save_weights(str(tmp_path / "model.weights.h5"))
    fresh = _build(batches, True, "adagrad")
    with pytest.raises(OptimizerLayoutError, match=r"holds 33 variables of optimizer .*Adagrad.*has 17 in the plain"):
        fresh.load_weights(str(tmp_path / "model.weights.h5"))


def test_optimizer_whose_slots_are_not_per_row_cannot_be_saved_silently(batches, tmp_path):
    model = ctr_models.wide_and_deep(FIELDS, N_DENSE, hidden=(16, 8), seed=7)
    model({k: tf.zeros_like(v) for k, v in batches[0][0].items()})
    model = htf.keras.optimize(model)
    model.compile(optimizer=tf.keras.optimizers.Adafactor(0.01), loss="binary_crossentropy")
    model.train_on_batch(*batches[0])
    with pytest.raises(OptimizerLayoutError, match=r"Adafactor keeps a variable .*not a slot of one model variable"):
        model.save_weights(str(tmp_path / "ckpt"))


@pytest.mark.parametrize(("saved", "loaded"), [("lazy", "adam"), ("adam", "lazy")])
def test_lazy_adam_and_adam_state_are_not_interchanged(saved, loaded, batches, tmp_path):
    optimizers = {"lazy": lambda: htf.keras.LazyAdam(0.01), "adam": lambda: tf.keras.optimizers.Adam(0.01)}
    source = ctr_models.wide_and_deep(FIELDS, N_DENSE, hidden=(16, 8), seed=7)
    source({k: tf.zeros_like(v) for k, v in batches[0][0].items()})
    source.compile(optimizer=optimizers[saved](), loss="binary_crossentropy")  # the plain model: either writes it
    source.train_on_batch(*batches[0])
    source.save_weights(str(tmp_path / "model.weights.h5"))
    fresh = _build(batches, True, "adam")
    fresh.compile(optimizer=optimizers[loaded](), loss="binary_crossentropy")
    with pytest.raises(OptimizerLayoutError, match="moments of rows absent from a batch"):
        fresh.load_weights(str(tmp_path / "model.weights.h5"))

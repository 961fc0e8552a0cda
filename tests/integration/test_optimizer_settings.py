"""Optimizer settings on packed tables: the exact ones train like the plain model, the others are named.

Keras optimizers other than the fused ones update the packed variables through Keras itself, which is
exact when the update is elementwise per row. Gradient clipping (per-lookup rows in Keras, summed
distinct rows in a packed table), Keras's Nadam (its ``u_product`` counts the model's variables) and
Adafactor (factored over a whole variable) are not: ``compile`` warns once, naming each. The fused
updates take a ``LearningRateSchedule``'s rate of the current step, as Keras does (they run before
Keras's ``apply_gradients`` computes it: they used the previous step's).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

VOCABS = (30, 50, 70)
K = tf.keras.optimizers


def _model():
    tf.keras.utils.set_random_seed(1)
    inputs = [tf.keras.Input((1,), dtype="int64", name=f"f{i}") for i in range(len(VOCABS))]
    rows = [
        tf.keras.layers.Flatten()(tf.keras.layers.Embedding(v, 4, name=f"e{i}")(x))
        for i, (v, x) in enumerate(zip(VOCABS, inputs))
    ]
    h = tf.keras.layers.Dense(8, activation="relu")(tf.keras.layers.Concatenate()(rows))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(h))


def _batches(steps=12):
    rng = np.random.default_rng(0)
    return [
        (
            {f"f{i}": rng.integers(0, v, (16, 1)) for i, v in enumerate(VOCABS)},
            rng.integers(0, 2, (16, 1)).astype(np.float32),
        )
        for _ in range(steps)
    ]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "hybridtf" and r.levelno == logging.WARNING]


EXACT = {
    "sgd_nesterov": lambda: K.SGD(0.1, momentum=0.9, nesterov=True),
    "rmsprop_centered": lambda: K.RMSprop(0.01, momentum=0.5, centered=True),
    "adamw": lambda: K.AdamW(0.01, weight_decay=0.01),
    "ftrl": lambda: K.Ftrl(0.05, l1_regularization_strength=0.001),
    "legacy_nadam": lambda: K.legacy.Nadam(0.01),
    # fused updates with a learning-rate schedule
    "sgd_schedule": lambda: K.SGD(K.schedules.ExponentialDecay(0.5, 2, 0.5)),
    "adagrad_schedule": lambda: K.Adagrad(K.schedules.ExponentialDecay(0.2, 2, 0.5)),
    "adam_schedule": lambda: K.Adam(K.schedules.PiecewiseConstantDecay([3, 6], [0.05, 0.01, 0.001])),
    "lazy_adam_schedule": lambda: htf.keras.LazyAdam(K.schedules.InverseTimeDecay(0.05, 1, 0.5)),
    "loss_scale_adam": lambda: tf.keras.mixed_precision.LossScaleOptimizer(K.Adam(0.01)),
    "adagrad_clipvalue": lambda: K.Adagrad(0.05, clipvalue=0.001),  # clipped per lookup (rewrite/gradient_norms.py)
}


@pytest.mark.parametrize("name", list(EXACT))
def test_keras_updated_optimizers_train_packed_tables_exactly_without_a_warning(name, caplog):
    batches = _batches()
    plain = _model()
    plain.compile(optimizer=EXACT[name](), loss="binary_crossentropy")
    packed = htf.keras.optimize(_model())
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        packed.compile(optimizer=EXACT[name](), loss="binary_crossentropy")
    assert _warnings(caplog) == []
    expected = [plain.train_on_batch(x, y) for x, y in batches]
    np.testing.assert_allclose([packed.train_on_batch(x, y) for x, y in batches], expected, rtol=1e-5)


INEXACT = {
    "clipvalue_loss_scale": (
        lambda: tf.keras.mixed_precision.LossScaleOptimizer(K.Adagrad(0.05, clipvalue=0.001)),
        "clipvalue: Keras clips each lookup's gradient row",
    ),
    "nadam": (lambda: K.Nadam(0.01), "legacy.Nadam has no such dependence"),
    "adafactor": (lambda: K.Adafactor(0.01), "Adafactor: its factored second moments"),
}


@pytest.mark.parametrize("name", list(INEXACT))
def test_settings_that_differ_on_packed_tables_are_named_in_one_warning(name, caplog):
    make, text = INEXACT[name]
    packed = htf.keras.optimize(_model())
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        packed.compile(optimizer=make(), loss="binary_crossentropy")
        packed.compile(optimizer=packed.optimizer, loss="binary_crossentropy")  # compiled again: no second warning
    [message] = _warnings(caplog)
    assert "will NOT equal the plain model's" in message and text in message
    x, y = _batches(1)[0]
    packed.train_on_batch(x, y)  # still trains


def test_the_named_difference_is_real():
    """Keras's Nadam changes the packed model's losses (fewer variables): the warning is not a false alarm."""
    batches = _batches()
    losses = []
    for wrap in (False, True):
        model = htf.keras.optimize(_model()) if wrap else _model()
        model.compile(optimizer=K.Nadam(0.05), loss="binary_crossentropy")
        losses.append([model.train_on_batch(x, y) for x, y in batches])
    assert np.max(np.abs(np.subtract(*losses)) / np.abs(losses[0])) > 1e-5


def _exclude_by_name(model):
    optimizer = K.AdamW(0.01, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["embeddings"])
    return model, optimizer


def _exclude_views(model):  # the tables' variables as the model holds them when compiled
    optimizer = K.AdamW(0.01, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_list=[model.get_layer(f"e{i}").embeddings for i in range(3)])
    return model, optimizer


def _exclude_before_optimize(model):  # the plain variables, before packing released them
    optimizer = K.AdamW(0.01, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_list=[model.get_layer(f"e{i}").embeddings for i in range(3)])
    return model, optimizer


@pytest.mark.parametrize("setup", [_exclude_by_name, _exclude_views, _exclude_before_optimize])
def test_weight_decay_exclusions_of_packed_tables_train_like_the_plain_model(setup):
    batches = _batches(8)
    plain, plain_opt = setup(_model())
    plain.compile(optimizer=plain_opt, loss="binary_crossentropy")
    if setup is _exclude_before_optimize:
        packed, packed_opt = setup(_model())
        packed = htf.keras.optimize(packed)
    else:
        packed, packed_opt = setup(htf.keras.optimize(_model()))
    packed.compile(optimizer=packed_opt, loss="binary_crossentropy")
    expected = [plain.train_on_batch(x, y) for x, y in batches]
    np.testing.assert_allclose([packed.train_on_batch(x, y) for x, y in batches], expected, rtol=1e-5)


def test_weight_decay_excluding_only_some_tables_of_a_packed_variable_names_them_and_the_fix():
    packed = htf.keras.optimize(_model())
    optimizer = K.AdamW(0.01, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["e0/"])
    packed.compile(optimizer=optimizer, loss="binary_crossentropy")
    x, y = _batches(1)[0]
    with pytest.raises(ValueError, match=r"excludes tables \['e0'\].*exclude=\['e0'\]"):
        packed.train_on_batch(x, y)


def test_lazy_adam_refuses_amsgrad_when_built_with_the_fix():
    with pytest.raises(ValueError, match=r"amsgrad=True.*tf\.keras\.optimizers\.Adam\(amsgrad=True\)"):
        htf.keras.LazyAdam(0.01, amsgrad=True)


def test_the_clipping_warning_says_why_clipping_is_not_exact_here():
    """Under Horovod the warning names Horovod (a probe could not tell why one process was exact and 2 ranks not)."""
    import types

    from hybridtf._src.integrations.keras_optimizers import _clipping_context, inexact_settings

    optimizer = tf.keras.optimizers.Adam(0.01, clipnorm=1.0)
    two_ranks = _clipping_context(types.SimpleNamespace(distributed=True, size=2))
    (reason,) = inexact_settings(optimizer, False, two_ranks)
    assert "under Horovod (2 ranks)" in reason and "in one process" in reason and reason.startswith("clipnorm")
    (reason,) = inexact_settings(optimizer, False, _clipping_context(types.SimpleNamespace(distributed=False)))
    assert "micro-batches" in reason and "Horovod" not in reason
    assert inexact_settings(optimizer, True, two_ranks) == []  # exact clipping: nothing to warn

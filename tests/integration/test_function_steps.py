"""``htf.function`` steps over an optimized Keras model, as users write them: what the step's own code does
besides the lookups.

* A seeded ``Dropout`` draws the plain ``tf.function`` step's masks (the record pass keeps the layers' legacy
  seeds).
* Several optimizers: a step that splits the variables without ``htf.keras.layer_variables`` is warned once
  (a split by a table's name or by position sees the packed variables); one that uses it is not.
* Distillation: an optimized teacher called before the tape, its optimized student inside it. Each model's
  lookups are built at its own first lookup (before, all of the step's at the first: the student's outside
  its tape, refused; found by a probe).

Models and batches are ``test_layers_and_function``'s.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from tests.integration.test_layers_and_function import LOOP_STEPS, ONE_HOT, _batches, _model_pair, _train_step


@pytest.fixture(scope="module")
def keras_data():
    return _batches(LOOP_STEPS)


def test_custom_loop_with_seeded_dropout_draws_the_plain_models_masks(keras_data):
    """htf.function's record pass calls the model once more: a seeded Dropout's legacy seed must not move on."""
    losses = []
    for model, compile_fn in zip(_model_pair(dropout=0.3), (tf.function, htf.function)):
        tf.keras.utils.set_random_seed(123)
        step = _train_step(model, tf.keras.optimizers.Adagrad(0.05), compile_fn)
        losses.append([step(x, y).numpy() for x, y in keras_data[:LOOP_STEPS]])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)


def test_a_step_with_two_optimizers_is_told_how_to_split_the_variables(keras_data, caplog):
    """A split by a table's name finds no packed variable: the step's two optimizers get one warning per model."""
    _, wrapped = _model_pair()
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    tables_opt, dense_opt = tf.keras.optimizers.Adagrad(0.05), tf.keras.optimizers.Adam(0.01)

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, wrapped(x, training=True))
        variables = wrapped.trainable_variables
        grads = tape.gradient(loss, variables)
        pairs = list(zip(grads, variables))
        tables_opt.apply_gradients([(g, v) for g, v in pairs if "emb_" in v.name])
        dense_opt.apply_gradients([(g, v) for g, v in pairs if "emb_" not in v.name])
        return loss

    with caplog.at_level("WARNING", logger="hybridtf"):
        for x, y in keras_data[:2]:
            step(x, y)
    warnings = [r.getMessage() for r in caplog.records if "trained with 2 optimizers" in r.getMessage()]
    assert len(warnings) == 1 and "layer_variables(model, layers)" in warnings[0]
    assert "emb_" + next(iter(ONE_HOT)) in warnings[0]  # names the tables each packed variable holds


def test_a_step_that_splits_with_layer_variables_is_not_warned(keras_data, caplog):
    _, wrapped = _model_pair()
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    tables_opt, dense_opt = tf.keras.optimizers.Adagrad(0.05), tf.keras.optimizers.Adam(0.01)
    embeddings = [layer for layer in wrapped.layers if layer.name.startswith("emb_")]

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, wrapped(x, training=True))
        tables = htf.keras.layer_variables(wrapped, embeddings)
        rest = [v for v in wrapped.trainable_variables if all(v is not t for t in tables)]
        grads = tape.gradient(loss, tables + rest)
        tables_opt.apply_gradients(zip(grads[: len(tables)], tables))
        dense_opt.apply_gradients(zip(grads[len(tables) :], rest))
        return loss

    with caplog.at_level("WARNING", logger="hybridtf"):
        step(*keras_data[0])
    assert not [r for r in caplog.records if "optimizers" in r.getMessage()]


def test_a_teacher_called_before_the_tape_and_its_student_inside_it(keras_data):
    bce = tf.keras.losses.BinaryCrossentropy()
    results = []
    for compile_fn in (tf.function, htf.function):
        teacher, _ = _model_pair()
        student_plain, student = _model_pair(dropout=0.1)
        if compile_fn is tf.function:
            student = student_plain
        teacher = htf.keras.optimize(teacher) if compile_fn is htf.function else teacher
        optimizer = tf.keras.optimizers.Adagrad(0.05)

        @compile_fn
        def step(x, y, teacher=teacher, student=student, optimizer=optimizer):
            soft = teacher(x, training=False)  # no gradient wanted: before the tape
            with tf.GradientTape() as tape:
                p = student(x, training=True)
                loss = bce(y, p) + bce(soft, p)
            grads = tape.gradient(loss, student.trainable_variables)
            optimizer.apply_gradients(zip(grads, student.trainable_variables))
            return loss

        tf.keras.utils.set_random_seed(11)
        results.append([step(x, y).numpy() for x, y in keras_data[:LOOP_STEPS]])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=0)


def test_an_htf_function_step_is_not_taken_for_a_call_outside_the_model(keras_data, caplog):
    """htf.function's record pass runs the optimized model's lookups directly, under the step's tape."""
    _, wrapped = _model_pair()
    step = _train_step(wrapped, tf.keras.optimizers.Adagrad(0.05), htf.function)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        for x, y in keras_data[:2]:
            step(x, y)
    assert not [r for r in caplog.records if "outside the model that packed" in r.getMessage()]

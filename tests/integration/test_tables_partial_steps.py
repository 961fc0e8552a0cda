"""Steps over a Tables set that look up only some tables of a packed variable.

Plain TensorFlow skips a table variable that got no gradient. A packed
variable has a gradient as soon as one of its tables has one, and Keras's Adam
moves every row of a variable with a gradient (its moments decay everywhere), so
the tables the step did not look up move too. ``hybridtf.function`` says so,
naming the tables and the fix; the fix (a plan that packs them apart) is exact,
and a row-local optimizer (Adagrad) is exact without it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf.embedding import TableConfig, Tables

IDS = tf.constant([1, 2, 3])


def _configs():
    rng = np.random.default_rng(0)
    return [TableConfig(n, 10, 4, initializer=rng.normal(size=(10, 4)).astype(np.float32)) for n in ("a", "b")]


def _train(lookup, variables, optimizer, decorate):
    optimizer.build(variables)

    @decorate
    def step(name):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(lookup(name, IDS)))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return loss

    return [float(step(name)) for name in ("b", "a", "a")]  # "b" trained once, then two steps of "a" alone


def _plain(optimizer):
    variables = {c.name: tf.Variable(c.initializer) for c in _configs()}
    losses = _train(
        lambda n, i: tf.nn.embedding_lookup(variables[n], i), list(variables.values()), optimizer, tf.function
    )
    return losses, variables["b"].numpy()


def _packed(optimizer, plan=None):
    configs = _configs()
    tables = Tables(configs, plan=plan(configs) if plan else None)
    losses = _train(tables.lookup, list(tables.trainable_variables), optimizer, htf.function)
    return losses, tables.table("b").numpy()


def test_adam_on_a_partly_looked_up_packed_variable_is_warned_about_with_the_fix(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        _packed(tf.keras.optimizers.Adam(0.1))
    text = caplog.text
    assert "looks up tables ['a'] of packed variable" in text and "but not ['b']" in text
    assert "exclude=['b']" in text


def test_the_fix_named_in_the_warning_is_exact(caplog):
    plain_losses, plain_b = _plain(tf.keras.optimizers.Adam(0.1))

    def apart(configs):
        return htf.plan.plan_packing([c.spec() for c in configs], exclude=["b"])

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        losses, b = _packed(tf.keras.optimizers.Adam(0.1), plan=apart)
    assert "looks up tables" not in caplog.text
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(b, plain_b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", [lambda: tf.keras.optimizers.Adagrad(0.1), lambda: tf.keras.optimizers.SGD(0.1)])
def test_row_local_optimizers_are_exact_and_not_warned_about(make, caplog):
    plain_losses, plain_b = _plain(make())
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        losses, b = _packed(make())
    assert "looks up tables" not in caplog.text
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(b, plain_b, rtol=1e-6, atol=1e-7)

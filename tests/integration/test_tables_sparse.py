"""SparseTensor bags through the functional Tables API and the EmbeddingBag layer.

A ``tf.SparseTensor`` of ids is a bag per row, whatever the order of its
indices and the gaps between its column indices, as for
``tf.nn.safe_embedding_lookup_sparse``; hybridtf once took its rows in index
order (a hand-built tensor's rows were swapped silently), refused gaps with
TensorFlow's "not right-ragged" assertion, and that assertion op made
``hybridtf.function`` refuse a SparseTensor argument.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf.embedding import TableConfig, Tables

VOCAB, DIM = 12, 4
# Rows listed out of order (row 2 first), row 0 with a gap in its columns (0, 3), row 1 empty.
INDICES = [[2, 1], [0, 3], [2, 0], [0, 0], [3, 2]]
VALUES = [5, 7, 1, 3, 11]
SHAPE = [4, 5]


def _sparse(values=VALUES):
    return tf.SparseTensor(INDICES, tf.constant(values, tf.int64), SHAPE)


def _init():
    return np.random.default_rng(3).normal(size=(VOCAB, DIM)).astype(np.float32)


def _tables():
    # two same-dim tables: packed together, "user" at row offset 0 and "item" behind it
    return Tables([TableConfig("user", VOCAB, DIM, initializer=_init()), TableConfig("item", VOCAB, DIM)])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("mode", ["eager", "tf.function", "htf.function"])
def test_sparse_bags_in_any_index_order_match_safe_embedding_lookup_sparse(combiner, mode):
    tables = _tables()
    ref_var = tf.Variable(_init())
    sp = _sparse()

    def lookup(s):
        with tf.GradientTape() as tape:
            out = tables.lookup("user", s, combiner)
            loss = tf.reduce_sum(out * tf.range(1.0, 1.0 + DIM))
        return out, tape.gradient(loss, tables.trainable_variables)[0]

    fn = {"eager": lookup, "tf.function": tf.function(lookup), "htf.function": htf.function(lookup)}[mode]
    out, grad = fn(sp)
    with tf.GradientTape() as tape:
        ref = tf.nn.safe_embedding_lookup_sparse(ref_var, sp, combiner=combiner)
        ref_loss = tf.reduce_sum(ref * tf.range(1.0, 1.0 + DIM))
    ref_grad = tf.convert_to_tensor(tape.gradient(ref_loss, ref_var))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)
    # the packed variable's gradient: "user"'s rows first
    grad = tf.convert_to_tensor(grad).numpy()
    np.testing.assert_allclose(grad[:VOCAB], ref_grad.numpy(), rtol=1e-6, atol=1e-7)
    assert not grad[VOCAB:].any()


def test_a_training_step_over_sparse_bags_under_htf_function_equals_plain_variables():
    tables = _tables()
    ref_var = tf.Variable(_init())
    opt, ref_opt = tf.keras.optimizers.Adagrad(0.1), tf.keras.optimizers.Adagrad(0.1)

    @htf.function
    def step(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tables.lookup("user", s, "mean") - 1.0))
        grads = tape.gradient(loss, tables.trainable_variables)
        opt.apply_gradients(zip(grads, tables.trainable_variables))
        return loss

    @tf.function
    def ref_step(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.nn.safe_embedding_lookup_sparse(ref_var, s, combiner="mean") - 1.0))
        ref_opt.apply_gradients([(tape.gradient(loss, ref_var), ref_var)])
        return loss

    for i in range(4):
        sp = _sparse([(v + i) % VOCAB for v in VALUES])
        np.testing.assert_allclose(float(step(sp)), float(ref_step(sp)), rtol=1e-5)
    np.testing.assert_allclose(tables.table("user").numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-7)


def test_embedding_bag_layer_takes_unordered_sparse_bags():
    layer = htf.layers.EmbeddingBag(VOCAB, DIM, combiner="sum")
    layer.build(None)
    layer.set_weights([_init()])
    ref = tf.nn.safe_embedding_lookup_sparse(tf.constant(_init()), _sparse(), combiner="sum")
    np.testing.assert_allclose(layer(_sparse()).numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)


def test_a_sparse_row_index_outside_the_batch_is_an_error():
    tables = _tables()
    bad = tf.SparseTensor([[0, 0], [4, 0]], tf.constant([1, 2], tf.int64), [2, 3])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        tf.function(lambda s: tables.lookup("user", s, "sum"))(bad)

"""``clipnorm`` / ``global_clipnorm`` / ``clipvalue`` on packed tables clip exactly as Keras clips the plain model.

Keras measures (and ``clipvalue`` clips) a table's gradient as one row per lookup position; a packed table's
gradient has one summed row per distinct id and spans several tables. hybridtf measures (or clips) each table on
its lookups' own gradients (``rewrite/gradient_norms.py``): a table looked up twice, a sequence, a regularized
table (dense in Keras), a bag (one row per id in its own chain) and ordinary one-hot tables, with clipping that
really clips.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.layers import EmbeddingBag

L = tf.keras.layers
BATCH, STEPS = 32, 15


def _model(regularized=True):
    tf.keras.utils.set_random_seed(1)
    a = tf.keras.Input((1,), dtype=tf.int64, name="a")
    seq = tf.keras.Input((3,), dtype=tf.int64, name="seq")
    c = tf.keras.Input((1,), dtype=tf.int64, name="c")
    bag = tf.keras.Input((None,), dtype=tf.int64, ragged=True, name="bag")
    penalty = tf.keras.regularizers.l2(1e-3) if regularized else None
    shared = L.Embedding(30, 4, name="shared")  # looked up twice: its rows of both lookups count
    parts = [
        L.Flatten()(shared(a)),
        L.Flatten()(shared(c)),
        L.GlobalAveragePooling1D()(L.Embedding(20, 4, name="sequence")(seq)),
        L.Flatten()(L.Embedding(25, 4, embeddings_regularizer=penalty, name="reg")(a)),
        EmbeddingBag(15, 4, combiner="mean", name="bag_table")(bag),
        L.Flatten()(L.Embedding(12, 1, name="wide")(c)),
    ]
    hidden = L.Dense(8, activation="relu")(L.Concatenate()(parts))
    return tf.keras.Model([a, seq, c, bag], L.Dense(1, activation="sigmoid")(hidden))


def _batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, BATCH)
        bag = tf.RaggedTensor.from_row_lengths(rng.integers(0, 15, int(lengths.sum())), lengths)
        x = {
            "a": rng.integers(0, 10, (BATCH, 1)),  # few distinct ids: many repeated rows
            "seq": rng.integers(0, 20, (BATCH, 3)),
            "c": rng.integers(0, 10, (BATCH, 1)),
            "bag": bag,
        }
        out.append((x, rng.integers(0, 2, (BATCH, 1)).astype(np.float32)))
    return out


OPTIMIZERS = {
    "adam_clipnorm": lambda: tf.keras.optimizers.Adam(0.05, clipnorm=0.02),
    "adam_global_clipnorm": lambda: tf.keras.optimizers.Adam(0.05, global_clipnorm=0.05),
    "sgd_clipnorm": lambda: tf.keras.optimizers.SGD(0.5, clipnorm=0.01),
    "adagrad_global_clipnorm": lambda: tf.keras.optimizers.Adagrad(0.1, global_clipnorm=0.02),
    "adam_clipvalue": lambda: tf.keras.optimizers.Adam(0.05, clipvalue=0.002),
    "adagrad_clipvalue": lambda: tf.keras.optimizers.Adagrad(0.3, clipvalue=0.004),
    "sgd_clipvalue_and_clipnorm": lambda: tf.keras.optimizers.SGD(0.5, clipnorm=0.01, clipvalue=1e-4),  # Keras: norm
}


def _train(model, optimizer, batches):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_clipping_that_clips_trains_packed_tables_as_the_plain_model(name, caplog):
    batches = _batches()
    expected = _train(_model(), OPTIMIZERS[name](), batches)
    packed = htf.keras.optimize(_model())
    assert packed.hybridtf_skipped == []
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        got = _train(packed, OPTIMIZERS[name](), batches)
    assert not [r for r in caplog.records if "NOT equal" in r.getMessage()]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    unclipped = OPTIMIZERS[name]().get_config()
    unclipped.update(clipnorm=None, global_clipnorm=None, clipvalue=None)
    free = _train(_model(), type(OPTIMIZERS[name]()).from_config(unclipped), batches)
    assert np.max(np.abs(free - expected)) > 1e-3  # the clipping clipped
    assert packed.hybridtf_fused_concats == []  # the fusions are off while the lookups' gradients are measured


def test_clipvalue_clips_each_lookups_rows_before_a_repeated_id_sums_them():
    """Clipping the summed rows instead would train differently: the check above can tell the two apart."""
    batches = _batches()
    expected = _train(_model(regularized=False), tf.keras.optimizers.SGD(1.0, clipvalue=0.002), batches)
    packed = htf.keras.optimize(_model(regularized=False))
    got = _train(packed, tf.keras.optimizers.SGD(1.0, clipvalue=0.002), batches)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    summed = packed._htf_runtime.storage.gradient_norms
    assert summed is not None and summed.clipvalue == 0.002
    # the same packed model with the rows clipped after summing: measurably another training run
    repacked = htf.keras.optimize(_model(regularized=False))
    repacked.compile(optimizer=tf.keras.optimizers.SGD(1.0), loss="binary_crossentropy")
    after_sum = []
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, repacked(x, training=True)))
        grads = tape.gradient(loss, repacked.trainable_variables)
        clipped = [tf.clip_by_value(g, -0.002, 0.002) for g in grads]
        repacked.optimizer.apply_gradients(zip(clipped, repacked.trainable_variables))
        after_sum.append(loss.numpy())
    assert np.max(np.abs(np.array(after_sum) - expected)) > 1e-5


@pytest.mark.parametrize(
    "clipping", [{"clipnorm": 0.02}, {"global_clipnorm": 0.05}, {"clipvalue": 0.002}], ids=lambda c: next(iter(c))
)
def test_a_custom_loops_clipping_optimizer_clips_exactly(clipping):
    """An optimizer ``compile`` never saw, hooked by ``htf.function``: measured and clipped the same way."""
    _custom_loop_against_plain(regularized=False, **clipping)


@pytest.mark.parametrize("clipping", [{"clipnorm": 0.02}, {"global_clipnorm": 0.05}], ids=lambda c: next(iter(c)))
def test_gradients_the_step_turns_dense_are_clipped_exactly(clipping):
    """Gradient accumulation converts the tape's IndexedSlices to dense tensors: Keras then measures the summed
    rows in the plain model too, which the packed gradient's rows are (not the lookups' per-position rows)."""
    _custom_loop_against_plain(regularized=False, dense=True, **clipping)


def test_clipvalue_of_a_gradient_the_step_turns_dense_is_named_inexact(caplog):
    """The lookups' rows were clipped before they were summed; Keras clips the dense tensor's summed rows."""
    packed = htf.keras.optimize(_model(regularized=False))
    optimizer = tf.keras.optimizers.SGD(0.5, clipvalue=0.002)
    x, y = _batches()[0]

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, packed(x, training=True)))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, packed.trainable_variables)]
        optimizer.apply_gradients(zip(grads, packed.trainable_variables))
        return loss

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        step(x, y)
    assert any("as a dense tensor" in r.getMessage() and "NOT the plain" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("clipping", [{"clipnorm": 0.01}, {"global_clipnorm": 0.01}, {"clipvalue": 0.001}])
def test_a_legacy_optimizers_clipping_is_named_inexact(caplog, clipping):
    """A tf.keras.optimizers.legacy optimizer clips in its own apply_gradients, on the packed rows."""
    packed = htf.keras.optimize(_model(regularized=False))
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        packed.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.5, **clipping), loss="binary_crossentropy")
    (kind,) = clipping
    (message,) = [r.getMessage() for r in caplog.records if f"{kind}:" in r.getMessage()]
    assert "NOT equal" in message and "tf.keras.optimizers.SGD with the same settings clips exactly" in message


def test_a_legacy_optimizers_clipping_in_a_custom_loop_is_named_inexact(caplog):
    """htf.function does not hook a legacy optimizer; its clipping is named as compile names it."""
    packed = htf.keras.optimize(_model(regularized=False))
    optimizer = tf.keras.optimizers.legacy.Adagrad(0.1, clipnorm=0.05)
    x, y = _batches()[0]

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, packed(x, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, packed.trainable_variables), packed.trainable_variables))
        return loss

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        step(x, y)
    assert any("clipnorm:" in r.getMessage() and "NOT equal" in r.getMessage() for r in caplog.records)


def test_a_custom_loop_whose_loss_leaves_out_the_penalties_trains_as_plain():
    """Its optimizer is not hooked (a hooked one adds the regularized tables' penalty gradients itself)."""
    _custom_loop_against_plain(regularized=True)


def _custom_loop_against_plain(regularized, dense=False, **clipping):
    def loop(model, decorate):
        optimizer = tf.keras.optimizers.Adam(0.05, **clipping)

        @decorate
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            if dense:
                grads = [tf.convert_to_tensor(g) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return np.array([step(x, y).numpy() for x, y in _batches()])

    expected = loop(_model(regularized), tf.function)
    np.testing.assert_allclose(loop(htf.keras.optimize(_model(regularized)), htf.function), expected, rtol=1e-5)


@pytest.mark.parametrize("clipping", [{"clipnorm": 0.01}, {"clipvalue": 0.01}], ids=lambda c: next(iter(c)))
def test_clipping_beside_dynamic_tables_is_named_inexact(caplog, clipping):
    """A DynamicEmbedding's update takes its own route: hybridtf does not measure it, and says so."""
    ids = tf.keras.Input((1,), dtype=tf.int64)
    x = L.Concatenate()(
        [L.Flatten()(htf.layers.DynamicEmbedding(4, name="dyn")(ids)), L.Flatten()(L.Embedding(10, 4)(ids))]
    )
    packed = htf.keras.optimize(tf.keras.Model(ids, L.Dense(1)(x)))
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        packed.compile(optimizer=tf.keras.optimizers.Adam(0.01, **clipping), loss="mse")
    (kind,) = clipping
    assert any(f"{kind}:" in r.getMessage() and "NOT equal" in r.getMessage() for r in caplog.records)
    assert packed._htf_runtime.storage.gradient_norms is None

"""hybridtf.estimator: Embedding layers with Keras L1/L2 regularizers pack, with the plain model_fn's math.

The model_fn adds its layers' ``losses`` to the loss, as a TF1 user does. Regularized tables of one dim share a
packed variable apart from the unregularized ones, so every table gets the update kind (dense or sparse) it gets in
the plain model_fn: momentum and FTRL move an unregularized table's untouched rows only when it gets a dense
gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator import LOSS_KEY, LossHook, _assert_losses_close, _config

FIELDS, VOCAB, DIM, BATCH = 6, 400, 4, 32


def _data(n=BATCH * 20, seed=3):
    rng = np.random.default_rng(seed)
    x = {f"C{i}": rng.integers(0, VOCAB - i, size=(n,)).astype(np.int64) for i in range(FIELDS)}
    y = (rng.random((n, 1)) < 0.4).astype(np.float32)
    return x, y


DATA = _data()


def input_fn():
    return tf.data.Dataset.from_tensor_slices(DATA).batch(BATCH).repeat()


def _init(seed):
    return tf.keras.initializers.RandomUniform(-0.2, 0.2, seed=seed)


def _deep_regularizer(i):
    return [tf.keras.regularizers.l2(1e-3), None, tf.keras.regularizers.l1(1e-3)][i % 3]


OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1),
}


def make_model_fn(optimizer, deep_regularizer=_deep_regularizer):
    """Wide & Deep: deep tables (dim 4) with l2 / none / l1, wide tables (dim 1) with l1_l2 on half of them."""

    def model_fn(features, labels, mode):
        layers, deep, wide = [], [], []
        for i in range(FIELDS):
            ids = features[f"C{i}"]
            emb = tf.keras.layers.Embedding(
                VOCAB - i,
                DIM,
                embeddings_initializer=_init(i),
                embeddings_regularizer=deep_regularizer(i),
                name=f"emb_C{i}",
            )
            lin = tf.keras.layers.Embedding(
                VOCAB - i,
                1,
                embeddings_initializer=_init(50 + i),
                embeddings_regularizer=tf.keras.regularizers.l1_l2(1e-4, 1e-3) if i < FIELDS // 2 else None,
                name=f"wide_C{i}",
            )
            deep.append(emb(ids))
            wide.append(lin(ids))
            layers += [emb, lin]
        hidden = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))
        out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=8))
        logit = out(hidden(tf.concat(deep, axis=1))) + tf.add_n(wide)
        pred = tf.sigmoid(logit)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
        penalties = [loss for layer in layers for loss in layer.losses]
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred)) + tf.add_n(penalties)
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        train_op = OPTIMIZERS[optimizer]().minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _train(fn, model_dir, steps, hooks=()):
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=_config())
    loss_hook = LossHook()
    est.train(input_fn, steps=steps, hooks=[loss_hook, *hooks])
    return est, np.array(loss_hook.losses)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_regularized_tables_pack_and_train_as_plain(tmp_path, optimizer):
    fn = make_model_fn(optimizer)
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    plain_est, plain = _train(fn, tmp_path / "plain", 40)
    wrapped_est, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 40, hooks)
    _assert_losses_close(wrapped, plain)
    report = hooks[0].report
    assert not report.skipped
    groups = {pt.name: {m.name for m in pt.members} for pt in report.plan.packed_tables}
    regularized = {f"emb_C{i}" for i in range(FIELDS) if i % 3 != 1} | {f"wide_C{i}" for i in range(FIELDS // 2)}
    assert set().union(*groups.values()) == {f"{k}_C{i}" for k in ("emb", "wide") for i in range(FIELDS)}
    for members in groups.values():  # regularized and unregularized tables never share a packed variable
        assert members <= regularized or not members & regularized
    assert len(groups) == 4  # dims 4 and 1, each with and without regularizers
    evaluated = [est.evaluate(input_fn, steps=3)["loss"] for est in (wrapped_est, plain_est)]
    np.testing.assert_allclose(*evaluated, rtol=1e-5)  # the penalties are in the evaluated loss too
    # The checkpoint is the plain model_fn's, slots included.
    assert dict(tf.train.list_variables(wrapped_est.model_dir)) == dict(tf.train.list_variables(plain_est.model_dir))
    for name in ("emb_C0/embeddings", "wide_C4/embeddings"):
        np.testing.assert_allclose(
            wrapped_est.get_variable_value(name), plain_est.get_variable_value(name), rtol=1e-5, atol=1e-6
        )


def test_zero_strength_and_no_op_regularizers(tmp_path):
    """l2(0.0) still sends Keras a dense (zero) gradient; L1L2(0, 0) is Keras's constant 0 (no gradient)."""

    def regularizer(i):
        return [tf.keras.regularizers.l2(0.0), tf.keras.regularizers.L1L2(0.0, 0.0), None][i % 3]

    fn = make_model_fn("momentum", regularizer)
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(fn, tmp_path / "plain", 25)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 25, hooks)
    _assert_losses_close(wrapped, plain)
    report = hooks[0].report
    assert not report.skipped
    location = {m.name: pt.name for pt in report.plan.packed_tables for m in pt.members}
    assert location["emb_C0"] != location["emb_C1"] == location["emb_C2"]


class Smooth(tf.keras.regularizers.Regularizer):
    def __call__(self, x):
        return 1e-3 * tf.reduce_sum(tf.math.softplus(x))


def test_regularizer_without_known_gradient_stays_unpacked(tmp_path):
    def regularizer(i):
        return Smooth() if i == 0 else tf.keras.regularizers.l2(1e-3)

    fn = make_model_fn("adagrad", regularizer)
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(fn, tmp_path / "plain", 10)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 10, hooks)
    _assert_losses_close(wrapped, plain)
    skipped = dict(hooks[0].report.skipped)
    assert list(skipped) == ["emb_C0"]
    assert "Smooth" in skipped["emb_C0"] and "l1 / l2 / l1_l2" in skipped["emb_C0"]

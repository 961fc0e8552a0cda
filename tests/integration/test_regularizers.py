"""Regularized embeddings pack with the same math, and ``optimize`` is never silent.

A model whose Embedding layers carry Keras L1 / L2 / L1L2 regularizers (any
strength, zero included; ``tf.keras.regularizers`` and the legacy
``tensorflow.python.keras.regularizers``), mixed with unregularized tables in
one packed table, trains exactly like the plain model: per-step losses within
1e-5 relative over 100 steps, with every fused optimizer (the regularizer's
gradient folded into ``RegularizedApply*``) and with optimizer configurations
Keras applies itself (clipping, momentum). A negative control shows the
comparison fails when the regularizer's gradient is left out.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.keras import regularizers as legacy_regularizers

import hybridtf as htf
from hybridtf._src.capture.keras_capture import is_captured

R = tf.keras.regularizers
STEPS = 100
BATCH = 32
VOCABS = {"a": 40, "b": 45, "c": 50, "d": 55, "e": 60, "f": 65, "g": 70}


def _regularizers():
    return {
        "a": R.l2(0.02),
        "b": None,  # unregularized member of the same packed table
        "c": R.l1(0.01),
        "d": R.l1_l2(0.01, 0.02),
        "e": R.l2(0.0),  # strength 0: Keras still gives a dense (zero) gradient
        "f": legacy_regularizers.l2(0.01),
        "g": R.l1_l2(0.0, 0.0),  # Keras adds a constant 0: no gradient, the table stays sparse (lazy)
    }


def _model(regs, constraint=None, seed=3):
    tf.keras.utils.set_random_seed(seed)
    ids = {k: tf.keras.Input(shape=(), dtype=tf.int64, name=k) for k in regs}
    embs = [
        tf.keras.layers.Embedding(
            VOCABS[k],
            4,
            name=f"emb_{k}",
            embeddings_regularizer=regs[k],
            embeddings_constraint=constraint if k == "a" else None,
            embeddings_initializer=tf.keras.initializers.RandomUniform(-0.3, 0.3),
        )(ids[k])
        for k in regs
    ]
    hidden = tf.keras.layers.Dense(8, activation="relu")(tf.keras.layers.Concatenate()(embs))
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, activation="sigmoid")(hidden))


def _batches(regs, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    # Ids from the lower half of each vocabulary: the upper rows are only ever moved by the regularizer.
    return [
        (
            {k: tf.constant(rng.integers(0, VOCABS[k] // 2, BATCH)) for k in regs},
            tf.constant(rng.integers(0, 2, (BATCH, 1)), tf.float32),
        )
        for _ in range(steps)
    ]


def _pair(regs, **optimize_kwargs):
    plain, packed = _model(regs), _model(regs)
    packed.set_weights(plain.get_weights())
    return plain, htf.keras.optimize(packed, **optimize_kwargs)


def _train(model, optimizer, batches):
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    "lazy_adam": lambda: htf.keras.LazyAdam(0.01),
    # Keras's own update of the packed table (not fused): the gradient gets the penalty's rows added.
    "adam_clipnorm": lambda: tf.keras.optimizers.Adam(0.01, clipnorm=5.0),
    "lazy_adam_clipnorm": lambda: htf.keras.LazyAdam(0.01, clipnorm=5.0),
    "sgd_momentum": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
}


FUSED = ("adagrad", "adam", "lazy_adam", "sgd")


@pytest.mark.parametrize(
    "opt", [o if o in FUSED else pytest.param(o, marks=pytest.mark.slow) for o in sorted(OPTIMIZERS)]
)
def test_regularized_tables_pack_and_train_exactly(opt):
    regs = _regularizers()
    plain, packed = _pair(regs)
    assert packed.hybridtf_skipped == []
    assert [pt.member_names for pt in packed.hybridtf_plan.packed_tables] == [[f"emb_{k}" for k in regs]]
    # Same penalty values before training (model.losses, one per regularized layer, same order).
    np.testing.assert_array_equal([float(v) for v in packed.losses], [float(v) for v in plain.losses])
    batches = _batches(regs, STEPS if opt in FUSED else 30)
    expected = _train(plain, OPTIMIZERS[opt](), batches)
    got = _train(packed, OPTIMIZERS[opt](), batches)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    for p, q in zip(packed.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([float(v) for v in packed.losses], [float(v) for v in plain.losses], rtol=1e-5)


def test_rows_outside_every_batch_move_only_by_the_regularizer():
    """Rows no batch touches: a regularized table's shrink (SGD: w * (1 - 2 * lr * l2)), an unregularized one's stay."""
    regs = {"a": R.l2(0.02), "b": None}
    _, packed = _pair(regs)
    before = {k: packed.get_layer(f"emb_{k}").embeddings.numpy() for k in regs}
    _train(packed, tf.keras.optimizers.SGD(0.1), _batches(regs, 3))
    after = {k: packed.get_layer(f"emb_{k}").embeddings.numpy() for k in regs}
    upper = slice(VOCABS["a"] // 2, None)
    w = before["a"][upper]
    for _ in range(3):
        w = w + (-(w * np.float32(0.04))) * np.float32(0.1)
    np.testing.assert_allclose(after["a"][upper], w, rtol=1e-6)
    np.testing.assert_array_equal(after["b"][VOCABS["b"] // 2 :], before["b"][VOCABS["b"] // 2 :])


def test_leaving_out_the_regularizer_gradient_breaks_exactness():
    """Negative control: the comparison above can fail (the folded gradient is what makes it pass)."""
    regs = _regularizers()
    plain, packed = _pair(regs)
    batches = _batches(regs, 20)
    expected = _train(plain, tf.keras.optimizers.Adagrad(0.05), batches)
    packed.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    packed.optimizer._htf_reg = {}  # drop the folded gradient; the penalty value is still added
    got = np.array([packed.train_on_batch(x, y) for x, y in batches])
    assert np.max(np.abs(got - expected) / expected) > 1e-4


def test_unsupported_regularizers_and_constraints_stay_unpacked_with_reason_and_one_warning(caplog):
    class Custom(tf.keras.regularizers.L2):  # a subclass may change the math: not trusted
        def __call__(self, x):
            return 3.0 * super().__call__(x)

    regs = {"a": None, "b": lambda w: 0.01 * tf.reduce_sum(w), "c": Custom(0.01), "d": R.l2(0.01)}
    plain, packed = _model(regs, constraint=tf.keras.constraints.NonNeg()), _model(regs, constraint="non_neg")
    packed.set_weights(plain.get_weights())
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        packed = htf.keras.optimize(packed)
    reasons = {s.name: s.reason for s in packed.hybridtf_skipped}
    assert set(reasons) == {"emb_a", "emb_b", "emb_c"}
    assert "embeddings_constraint" in reasons["emb_a"] and "remove the constraint" in reasons["emb_a"]
    assert "has no gradient formula" in reasons["emb_b"] and "l1 / l2 / l1_l2" in reasons["emb_b"]
    assert "Custom" in reasons["emb_c"]
    assert is_captured(packed.get_layer("emb_d")) and not is_captured(packed.get_layer("emb_b"))
    warnings = [r for r in caplog.records if r.name == "hybridtf" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert all(name in warnings[0].getMessage() for name in reasons)
    batches = _batches(regs, 20)
    np.testing.assert_allclose(
        _train(packed, tf.keras.optimizers.Adam(0.01), batches),
        _train(plain, tf.keras.optimizers.Adam(0.01), batches),
        rtol=1e-5,
    )


def test_nothing_packable_still_returns_plan_skipped_and_warns(caplog):
    regs = {"a": lambda w: 0.01 * tf.reduce_sum(w), "b": lambda w: 0.0 * tf.reduce_sum(w)}
    model = _model(regs)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model = htf.keras.optimize(model)
        assert htf.keras.optimize(model) is model  # a second call changes nothing and says nothing
    assert not htf.keras.is_optimized(model)
    assert model.hybridtf_plan.packed_tables == () and model.hybridtf_plan.num_lookup_chains == 0
    assert {s.name for s in model.hybridtf_skipped} == {"emb_a", "emb_b"}
    assert model.hybridtf_fused_concats == [] and model.hybridtf_fused_dense == []
    assert model.hybridtf_shared_uniques == {}
    assert len([r for r in caplog.records if r.name == "hybridtf"]) == 1
    model.compile(optimizer="adam", loss="binary_crossentropy")
    x, y = _batches(regs, 1)[0]
    assert np.isfinite(model.train_on_batch(x, y))


def test_all_excluded_tables_name_the_fix():
    model = htf.keras.optimize(_model({"a": None, "b": None}), exclude=["emb_a", "emb_b"])
    assert model.hybridtf_plan.packed_tables == ()
    assert all("exclude" in s.reason for s in model.hybridtf_skipped)


def test_fused_concats_lists_only_concatenations_traced_as_fused():
    regs = {"a": None, "b": None}
    tf.keras.utils.set_random_seed(1)
    ids = {k: tf.keras.Input(shape=(), dtype=tf.int64, name=k) for k in regs}
    dense_in = tf.keras.Input(shape=(3,), name="dense")
    embs = [tf.keras.layers.Embedding(VOCABS[k], 4, name=f"emb_{k}")(ids[k]) for k in regs]
    fused = tf.keras.layers.Concatenate(name="fused_concat")(embs)
    not_fused = tf.keras.layers.Concatenate(name="dense_concat")([dense_in, dense_in * 2.0])
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate(name="top")([fused, not_fused]))
    model = htf.keras.optimize(tf.keras.Model({**ids, "dense": dense_in}, out))
    assert model.hybridtf_fused_concats == []  # nothing traced yet
    model.compile(optimizer="adagrad", loss="mse")
    x, y = _batches(regs, 1)[0]
    model.train_on_batch({**x, "dense": tf.ones([BATCH, 3])}, y)
    # "top" holds the fused concatenation and is merged into it; the concatenation of dense inputs is not fused
    assert sorted(model.hybridtf_fused_concats) == ["fused_concat", "top"]


@pytest.mark.slow
def test_saved_formats_keep_weights_and_penalties(tmp_path):
    regs = {"a": R.l2(0.02), "b": None, "d": R.l1_l2(0.01, 0.02)}
    plain, packed = _pair(regs)
    batches = _batches(regs, 5)
    _train(packed, tf.keras.optimizers.Adagrad(0.05), batches)
    x = batches[0][0]
    want, penalties = packed.predict_on_batch(x), [float(v) for v in packed.losses]
    packed.save(str(tmp_path / "saved_model"))
    packed.save(str(tmp_path / "model.keras"))
    packed.save_weights(str(tmp_path / "ckpt" / "w"))
    plain.load_weights(str(tmp_path / "ckpt" / "w"))
    for loaded in (
        tf.keras.models.load_model(str(tmp_path / "saved_model")),
        tf.keras.models.load_model(str(tmp_path / "model.keras")),
        plain,
    ):
        np.testing.assert_allclose(loaded.predict_on_batch(x), want, rtol=1e-6)
        np.testing.assert_allclose([float(v) for v in loaded.losses], penalties, rtol=1e-6)

"""Canned Estimators' model_fns wrapped: every table packs and training equals the plain Estimator.

CTR teams often train ``tf.estimator.DNNLinearCombinedClassifier`` (Wide & Deep) or
``LinearClassifier`` as they come, with optimizer instances (``linear_optimizer=Ftrl(...)``). Such an
Estimator's ``model_fn`` goes through ``hybridtf.estimator.model_fn`` like a hand-written one:

* the optimizer instances are made outside the model_fn. The wrapper calls the model_fn twice
  (record pass, real pass); the record pass left them with a scratch graph's ``iterations`` and
  the real pass failed ("Cannot set `iterations` ...") where the plain Estimator trains;
* the linear part's ``[num_buckets, 1]`` weights (the v2 linear model layer) pack like v1
  ``linear_model``'s; they were left unpacked.

Canned Estimators' dense layers cannot be seeded, so both runs warm-start from one plain checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator import LOSS_KEY, LossHook

N, BATCH, STEPS, VOCAB, FIELDS = 1024, 64, 30, 40, 5
fc = tf.feature_column


def _data():
    rng = np.random.default_rng(3)
    x = {f"C{i}": rng.integers(0, VOCAB, size=(N, 1)).astype(np.int64) for i in range(FIELDS)}
    x["I0"] = rng.random((N, 1)).astype(np.float32)
    x["W"] = rng.random((N, 1)).astype(np.float32)  # the weights of a weighted_categorical_column
    return x, (rng.random((N, 1)) < 0.3).astype(np.float32)


DATA = _data()


def input_fn():
    return tf.data.Dataset.from_tensor_slices(DATA).batch(BATCH).repeat()


def _columns(weighted=False):
    cats = [fc.categorical_column_with_identity(f"C{i}", VOCAB) for i in range(FIELDS - 1)]
    cats.append(fc.categorical_column_with_hash_bucket(f"C{FIELDS - 1}", 30, dtype=tf.int64))
    if weighted:  # stays unpacked (weighted ids scale each row), reported with the reason; the rest packs
        cats[0] = fc.weighted_categorical_column(cats[0], "W")
    deep = [fc.embedding_column(c, 4) for c in cats] + [fc.numeric_column("I0")]
    return cats, deep


def _canned(kind, model_dir, lr, warm_start_from=None):
    legacy = tf.keras.optimizers.legacy
    cats, deep = _columns(weighted=kind == "weighted")
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=None, log_step_count_steps=None)
    common = dict(model_dir=str(model_dir), config=config, warm_start_from=warm_start_from)
    if kind in ("wide_deep", "weighted"):
        return tf.estimator.DNNLinearCombinedClassifier(
            linear_feature_columns=cats,
            dnn_feature_columns=deep,
            dnn_hidden_units=[16, 8],
            linear_optimizer=legacy.Ftrl(lr) if lr else legacy.SGD(0.0),
            dnn_optimizer=legacy.Adagrad(lr) if lr else legacy.SGD(0.0),
            **common,
        )
    if kind == "linear":
        return tf.estimator.LinearClassifier(cats, optimizer=legacy.Ftrl(lr) if lr else legacy.SGD(0.0), **common)
    return tf.estimator.DNNClassifier([16], deep, optimizer=legacy.Adam(lr) if lr else legacy.SGD(0.0), **common)


def _noting_loss(canned_model_fn):
    def model_fn(features, labels, mode, config):
        spec = canned_model_fn(features, labels, mode, config)
        tf.compat.v1.add_to_collection(LOSS_KEY, spec.loss)
        return spec

    return model_fn


def _train(kind, tmp_path, name, wrap, start):
    canned = _canned(kind, tmp_path / name, 0.05, warm_start_from=start)
    fn = _noting_loss(canned.model_fn)
    if wrap:
        fn = htf_estimator.model_fn(fn)
    est = tf.estimator.Estimator(fn, model_dir=canned.model_dir, config=canned.config, warm_start_from=start)
    hook = LossHook()
    est.train(input_fn, steps=STEPS, hooks=[hook])
    return est, np.array(hook.losses)


def _report(kind, tmp_path):
    fn = htf_estimator.model_fn(_canned(kind, tmp_path / "report", 0.05).model_fn)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
        fn(features, labels, tf.estimator.ModeKeys.TRAIN, tf.estimator.RunConfig())
    return htf_estimator.report_of(graph)


@pytest.mark.parametrize("kind", ["wide_deep", "linear", "dnn", "weighted"])
def test_canned_estimator_packs_every_table_and_trains_like_the_plain_one(tmp_path, kind):
    start = str(tmp_path / "start")
    _canned(kind, start, 0.0).train(input_fn, steps=1)  # one set of initial values for both runs

    report = _report(kind, tmp_path)
    packed = {m.name for pt in report.plan.packed_tables for m in pt.members}
    wide = {f"linear/linear_model/C{i}" for i in range(FIELDS)}
    deep = {f"dnn/input_from_feature_columns/input_layer/C{i}_embedding" for i in range(FIELDS)}
    if kind == "weighted":
        # a canned Estimator's optimizer takes its Keras layers' weights: the unpacked table's own variable there
        # (it failed with "has None for gradient" on the record pass's view of it)
        weighted = {
            "linear/linear_model/C0_weighted_by_W",
            "dnn/input_from_feature_columns/input_layer/C0_weighted_by_W_embedding",
        }
        assert {name for name, _ in report.skipped} == weighted
        assert all("weighted ids" in reason for _, reason in report.skipped)
        assert packed == (wide | deep) - {
            "linear/linear_model/C0",
            "dnn/input_from_feature_columns/input_layer/C0_embedding",
        }
    else:
        assert report.packed and not report.skipped and not report.unpacked_lookups
        assert packed == {"wide_deep": wide | deep, "linear": wide, "dnn": deep}[kind]

    plain_est, plain = _train(kind, tmp_path, "plain", False, start)
    wrapped_est, wrapped = _train(kind, tmp_path, "wrapped", True, start)
    assert len(wrapped) == len(plain) == STEPS
    rel = np.abs(wrapped - plain) / np.abs(plain)
    assert rel.max() < 1e-5, f"max relative loss difference {rel.max():.3g} at step {int(rel.argmax())}"
    assert abs(plain[-1] - plain[0]) > 1e-3  # it trained
    # the wrapped checkpoint holds the plain keys and values: the canned Estimator itself evaluates it
    ev_plain = _canned(kind, plain_est.model_dir, 0.05).evaluate(input_fn, steps=4)
    ev_wrapped = _canned(kind, wrapped_est.model_dir, 0.05).evaluate(input_fn, steps=4)
    np.testing.assert_allclose(ev_wrapped["loss"], ev_plain["loss"], rtol=1e-5)
    np.testing.assert_allclose(ev_wrapped["auc"], ev_plain["auc"], rtol=1e-4)


def _model_fn_with(held):
    def model_fn(features, labels, mode):
        if not held:  # made on the first call and kept (a lazily made module-level optimizer)
            held.append(tf.keras.optimizers.legacy.Adagrad(0.05))
        optimizer = held[0]
        emb = tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=tf.keras.initializers.RandomUniform(seed=2))
        x = tf.concat([tf.reshape(emb(features[f"C{i}"]), [-1, 4]) for i in range(FIELDS - 1)], axis=1)
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))
        logit = dense(x)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        optimizer.iterations = tf.compat.v1.train.get_global_step()
        updates = optimizer.get_updates(loss, [*emb.trainable_variables, *dense.trainable_variables])
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(updates))

    return model_fn


@pytest.mark.parametrize("made", ["before", "on_first_call"])
def test_a_legacy_optimizer_made_outside_the_model_fn_is_left_as_the_plain_model_fn_finds_it(tmp_path, made):
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=None, log_step_count_steps=None)
    losses = {}
    for wrap in (False, True):
        held = [tf.keras.optimizers.legacy.Adagrad(0.05)] if made == "before" else []
        fn = _model_fn_with(held)
        est = tf.estimator.Estimator(htf_estimator.model_fn(fn) if wrap else fn, str(tmp_path / str(wrap)), config)
        hook = LossHook()
        est.train(input_fn, steps=10, hooks=[hook])
        losses[wrap] = np.array(hook.losses)
        # the optimizer holds the real graph's weights only: the record pass's scratch graph left nothing on it
        assert all(w.graph is held[0].iterations.graph for w in held[0].weights)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
    assert losses[False][-1] < losses[False][0] - 1e-3

"""Feature columns in a wrapped model_fn: their tables are packed and train like the plain model_fn.

The TF1 way to write a Wide & Deep model_fn: ``input_layer`` over ``embedding_column``s (identity, hash
bucket, vocabulary list with out-of-vocabulary ids, a multi-hot SparseTensor feature with empty rows, a
``shared_embedding_columns`` pair; combiners mean / sum / sqrtn) for the deep part, ``linear_model`` over
the categorical columns for the wide part. Wrapped, every table is packed, per-step losses stay within
1e-5 of the plain model_fn (one optimizer, and FTRL on the ``linear_model`` scope + Adagrad on the rest),
the checkpoint holds the plain model_fn's keys and values, and evaluation, warm start from a plain
checkpoint, and the tables that cannot be packed (weighted column, ``max_norm``) are exact too.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator import LOSS_KEY, LossHook

N, BATCH, STEPS, VOCAB = 1024, 64, 40, 40
fc = tf.feature_column
fc1 = tf.compat.v1.feature_column


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = {f"C{i}": rng.integers(0, VOCAB, size=(N, 1)).astype(np.int64) for i in range(8)}
    x["C5"] = rng.integers(0, 2 * VOCAB, size=(N, 1)).astype(np.int64)  # half out of the vocabulary list
    x["W"] = rng.random((N, 1)).astype(np.float32)
    lengths = rng.integers(0, 4, size=N)
    hist = rng.integers(0, 30, size=(N, 3)).astype(np.int64)
    hist[np.arange(3)[None, :] >= lengths[:, None]] = -1  # padding: dropped by the column
    x["hist"] = hist
    y = (rng.random((N, 1)) < 0.3).astype(np.float32)
    return x, y


DATA = _data()


def input_fn():
    return tf.data.Dataset.from_tensor_slices(DATA).batch(BATCH).repeat()


def _init(seed):
    return tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=seed)


def _categorical():
    cats = [fc.categorical_column_with_identity(f"C{i}", VOCAB) for i in range(4)]
    cats.append(fc.categorical_column_with_hash_bucket("C4", 25, dtype=tf.int64))
    cats.append(fc.categorical_column_with_vocabulary_list("C5", list(range(VOCAB)), dtype=tf.int64))
    cats.append(fc.categorical_column_with_identity("hist", 30, default_value=None))
    return cats


def _deep_columns(extra=()):
    cats = _categorical()
    combiners = ["mean", "sum", "sqrtn", "mean", "mean", "sqrtn", "mean"]
    cols = [
        fc.embedding_column(c, 4, combiner=m, initializer=_init(i)) for i, (c, m) in enumerate(zip(cats, combiners))
    ]
    shared = [fc.categorical_column_with_identity(f"C{i}", VOCAB) for i in (6, 7)]
    cols += fc1.shared_embedding_columns(shared, 8, initializer=_init(20))
    return cols + list(extra)


def make_model_fn(two_optimizers=False, extra_columns=(), optimizer=None):
    def model_fn(features, labels, mode):
        features = dict(features)
        features["hist"] = tf.sparse.from_dense(features["hist"] + 1)  # ids + 1: padding -1 -> 0 is dropped
        features["hist"] = tf.SparseTensor(
            features["hist"].indices, features["hist"].values - 1, features["hist"].dense_shape
        )
        deep = fc1.input_layer(features, _deep_columns(extra_columns))
        h = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(7))(
            deep
        )
        logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))(h)
        logit += fc1.linear_model(features, _categorical())
        pred = tf.sigmoid(logit)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        step = tf.compat.v1.train.get_global_step()
        if two_optimizers:
            wide = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, scope="linear_model")
            rest = [v for v in tf.compat.v1.trainable_variables() if v not in wide]
            train_op = tf.group(
                tf.compat.v1.train.FtrlOptimizer(0.1).minimize(loss, var_list=wide),
                tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step, var_list=rest),
            )
        else:
            train_op = (optimizer() if optimizer else tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss, step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _train(fn, model_dir, steps=STEPS, warm_start_from=None):
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=None, log_step_count_steps=None)
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=config, warm_start_from=warm_start_from)
    hook = LossHook()
    est.train(input_fn, steps=steps, hooks=[hook])
    return est, np.array(hook.losses)


def _close(wrapped, plain, rtol=1e-5):
    assert len(wrapped) == len(plain) > 0
    rel = np.abs(wrapped - plain) / np.abs(plain)
    assert rel.max() < rtol, f"max relative loss difference {rel.max():.3g} at step {int(rel.argmax())}"
    assert abs(plain[-1] - plain[0]) > 1e-3  # it trained


def _report(fn):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
        fn(features=features, labels=labels, mode=tf.estimator.ModeKeys.TRAIN)
    return htf_estimator.report_of(graph)


TABLES = {
    *(f"input_layer/C{i}_embedding" for i in range(6)),
    "input_layer/hist_embedding",
    "input_layer/C6_C7_shared_embedding",
    *(f"linear_model/C{i}" for i in range(6)),
    "linear_model/hist",
}


@pytest.mark.parametrize("two_optimizers", [False, True], ids=["adagrad", "ftrl_wide_adagrad_deep"])
def test_feature_column_tables_are_packed_and_train_like_the_plain_model_fn(tmp_path, two_optimizers):
    fn = make_model_fn(two_optimizers)
    report = _report(htf_estimator.model_fn(fn))
    assert report.skipped == [] and report.unpacked_lookups == []
    assert {m.name for pt in report.plan.packed_tables for m in pt.members} == TABLES
    plain, plain_losses = _train(fn, tmp_path / "plain")
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped")
    _close(wrapped_losses, plain_losses)
    if two_optimizers:
        return
    keys = dict(tf.train.list_variables(plain.model_dir))
    assert dict(tf.train.list_variables(wrapped.model_dir)) == keys
    for key in ("input_layer/C6_C7_shared_embedding/embedding_weights", "linear_model/C5/weights"):
        np.testing.assert_allclose(wrapped.get_variable_value(key), plain.get_variable_value(key), rtol=1e-4, atol=1e-6)
    evaluated = [est.evaluate(lambda: input_fn().take(4))["loss"] for est in (plain, wrapped)]
    np.testing.assert_allclose(evaluated[1], evaluated[0], rtol=1e-5)

    # the exported SavedModel (loaded without the wrapper) predicts what the plain estimator predicts
    def serving_input_fn():
        inputs = {
            k: tf.compat.v1.placeholder(tf.as_dtype(v.dtype), [None, v.shape[1]], name=k) for k, v in DATA[0].items()
        }
        return tf.estimator.export.ServingInputReceiver(inputs, inputs)

    loaded = tf.saved_model.load(wrapped.export_saved_model(str(tmp_path / "export"), serving_input_fn))
    got = loaded.signatures["serving_default"](**{k: tf.constant(v[:BATCH]) for k, v in DATA[0].items()})["p"]
    expected = next(iter(plain.predict(lambda: input_fn().take(1), yield_single_examples=False)))["p"]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-7)
    # warm start from the plain checkpoint (deep tables only), then 20 steps: as the plain model_fn does
    warm = tf.estimator.WarmStartSettings(plain.model_dir, vars_to_warm_start=".*input_layer.*")
    losses = [
        _train(f, tmp_path / name, 20, warm)[1]
        for f, name in ((fn, "plain_warm"), (htf_estimator.model_fn(fn), "wrapped_warm"))
    ]
    _close(losses[1], losses[0])


def test_weighted_and_max_norm_columns_stay_unpacked_with_the_reason_and_train_exactly(tmp_path):
    weighted = fc.weighted_categorical_column(fc.categorical_column_with_identity("C0", VOCAB), "W")
    extra = [
        fc.embedding_column(weighted, 4, initializer=_init(30)),
        fc.embedding_column(fc.categorical_column_with_identity("C7", VOCAB), 4, initializer=_init(31), max_norm=0.5),
    ]
    fn = make_model_fn(extra_columns=extra)
    report = _report(htf_estimator.model_fn(fn))
    skipped = dict(report.skipped)
    assert "weighted ids" in skipped["input_layer/C0_weighted_by_W_embedding"]
    assert "max_norm" in skipped["input_layer/C7_embedding"]
    assert TABLES <= {m.name for pt in report.plan.packed_tables for m in pt.members}
    plain_losses = _train(fn, tmp_path / "plain", 20)[1]
    wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)[1]
    _close(wrapped_losses, plain_losses)


@pytest.mark.parametrize("dense_features", ["v2", "v1"])
def test_dense_features_tables_are_packed_and_train_like_the_plain_model_fn(tmp_path, dense_features):
    """``DenseFeatures`` (a Keras layer listing the tables among its weights), optimizer given the layers' weights."""

    def fn(features, labels, mode):
        cls = tf.keras.layers.DenseFeatures if dense_features == "v2" else tf.compat.v1.keras.layers.DenseFeatures
        columns = _deep_columns()[:5]
        if dense_features == "v2":  # with a pair of tf.feature_column.shared_embeddings
            shared = [fc.categorical_column_with_identity(f"C{i}", VOCAB) for i in (6, 7)]
            columns += fc.shared_embeddings(shared, 8, initializer=_init(21), shared_embedding_collection_name="c67")
        layer = cls(columns, name="deep_features")
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))
        logit = dense(layer(features))
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        var_list = layer.trainable_weights + dense.trainable_weights
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, tf.compat.v1.train.get_global_step(), var_list=var_list
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    report = _report(htf_estimator.model_fn(fn))
    assert report.skipped == [] and report.unpacked_lookups == []
    tables = {f"deep_features/C{i}_embedding" for i in range(5)} | ({"c67"} if dense_features == "v2" else set())
    assert {m.name for pt in report.plan.packed_tables for m in pt.members} == tables
    plain, plain_losses = _train(fn, tmp_path / "plain", 30)
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 30)
    _close(wrapped_losses, plain_losses)
    assert dict(tf.train.list_variables(wrapped.model_dir)) == dict(tf.train.list_variables(plain.model_dir))


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
        lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.9),
        lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1, l2_regularization_strength=0.1),
    ],
    ids=["momentum", "rmsprop", "proximal_adagrad"],
)
def test_examples_without_ids_update_row_zero_as_tensorflow_does(tmp_path, optimizer):
    """TensorFlow fills an example without ids (C5's out-of-vocabulary ids, empty histories) with id 0 and zeroes
    its result, so row 0's gradient entry is there (zero) and a stateful optimizer moves row 0 anyway."""
    fn = make_model_fn(optimizer=optimizer)
    wrapped_fn = make_model_fn(optimizer=optimizer)
    plain, plain_losses = _train(fn, tmp_path / "plain", 20)
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(wrapped_fn), tmp_path / "wrapped", 20)
    _close(wrapped_losses, plain_losses)
    for key in ("input_layer/C5_embedding/embedding_weights", "linear_model/hist/weights"):
        np.testing.assert_allclose(wrapped.get_variable_value(key), plain.get_variable_value(key), rtol=1e-4, atol=1e-6)


def test_default_id_fills_examples_without_ids_packed(tmp_path):
    """``safe_embedding_lookup_sparse(default_id=...)`` on a model_fn's own Keras table: packed, filled as TF does."""

    def fn(features, labels, mode):
        layer = tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=_init(3), name="hist_table")
        layer.build(None)
        ids = tf.sparse.from_dense(features["hist"] + 1)
        ids = tf.SparseTensor(ids.indices, ids.values - 1, ids.dense_shape)  # rows with no ids: empty examples
        pooled = tf.nn.safe_embedding_lookup_sparse(layer.embeddings, ids, combiner="sum", default_id=7)
        logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))(pooled)
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=opt.minimize(loss, tf.compat.v1.train.get_global_step())
        )

    report = _report(htf_estimator.model_fn(fn))
    assert report.skipped == [] and [m.name for pt in report.plan.packed_tables for m in pt.members] == ["hist_table"]
    plain_losses = _train(fn, tmp_path / "plain", 20)[1]
    wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)[1]
    _close(wrapped_losses, plain_losses)


def test_frozen_column_is_reported_once_with_its_reason():
    frozen = fc.embedding_column(fc.categorical_column_with_identity("C7", VOCAB), 4, trainable=False)
    report = _report(htf_estimator.model_fn(make_model_fn(extra_columns=[frozen])))
    assert dict(report.skipped) == {"input_layer/C7_embedding": "frozen (trainable=False) tables are not packed"}
    assert report.unpacked_lookups == []


def test_lookups_on_a_chain_of_their_own_are_reported_and_unsafe_lookups_are_packed(tmp_path):
    """A vocabulary column's ids come from a hash table built in the model_fn: packed, on a chain of its own.

    The report counts such lookups as packed and names them apart (they lose the shared chain); an
    ``embedding_column(use_safe_embedding_lookup=False)`` (``tf.nn.embedding_lookup_sparse``) is packed and exact.
    """
    unsafe = fc.embedding_column(fc.categorical_column_with_identity("C7", VOCAB), 4, use_safe_embedding_lookup=False)
    fn = make_model_fn(extra_columns=[unsafe])
    report = _report(htf_estimator.model_fn(fn))
    own = dict(report.own_chain_lookups)
    assert sorted(own) == ["input_layer/C5_embedding", "linear_model/C5"]
    assert all("LookupTableFindV2" in why or "hash_table" in why for why in own.values()), own
    packed_members = {m.name for pt in report.plan.packed_tables for m in pt.members}
    assert report.packed_lookups == len(packed_members) + 1  # the shared table is looked up twice
    summary = report.summary()
    assert "run a packed chain of their own" in summary and "'input_layer/C5_embedding'" in summary
    assert report.skipped == [] and "input_layer/C7_embedding" in packed_members
    _, plain = _train(fn, tmp_path / "plain", 20)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)
    _close(wrapped, plain)

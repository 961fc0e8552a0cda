"""A model_fn's own ``tf.compat.v1.get_variable`` tables: packed when the graph only looks them up, exact.

The TF1 way without layers or feature columns: plain variables looked up with ``tf.nn.embedding_lookup``
(v1 and v2), ``tf.gather``, ``tf.nn.embedding_lookup_sparse`` and ``tf.nn.safe_embedding_lookup_sparse``.
Wrapped, each is packed, per-step losses stay within 1e-5 of the plain model_fn (Adagrad and Adam), the
checkpoint holds the plain variables' names and values, evaluation and warm start agree. Variables that are
not only looked up (a dense kernel, a tied table, a get_variable regularizer, a partitioned table) stay
plain variables, and a looked-up one among them is named in the report.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator import (
    BATCH,
    DIM,
    FIELDS,
    LOSS_KEY,
    VOCAB,
    LossHook,
    _assert_losses_close,
    _config,
    _graph_spec,
    _head,
    _init,
    _mlp,
    input_fn,
)


def _sparse_ids(ids, drop_every=0):
    """A [batch, 2] SparseTensor of (ids, id + 1) per example; every ``drop_every``-th example but the last has none."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    pair = tf.stack([ids, (ids + 1) % VOCAB], axis=1)
    keep = tf.ones_like(pair, tf.bool)
    if drop_every:
        rows = tf.range(tf.shape(pair, out_type=tf.int64)[0])
        empty = tf.logical_and(tf.equal(rows % drop_every, 1), rows < tf.shape(pair, out_type=tf.int64)[0] - 1)
        keep = tf.logical_not(tf.tile(empty[:, None], [1, 2]))
    idx = tf.where(keep)
    return tf.SparseTensor(idx, tf.gather_nd(pair, idx), tf.shape(pair, out_type=tf.int64))


def _raw_model(features, labels, mode, optimizer):
    """Eight get_variable tables, each looked up another way, and a multi-hot one (safe lookup)."""
    parts = []
    with tf.compat.v1.variable_scope("deep"):
        for i in range(FIELDS):
            table = tf.compat.v1.get_variable(f"raw_C{i}", [VOCAB, DIM], initializer=_init(i))
            ids = features[f"C{i}"]
            kind = i % 4
            if kind == 0:
                parts.append(tf.nn.embedding_lookup(table, ids))
            elif kind == 1:
                parts.append(tf.compat.v1.nn.embedding_lookup(table, ids))
            elif kind == 2:
                parts.append(tf.gather(table, ids))
            else:  # examples without ids in between: a zero row, as TensorFlow gives
                parts.append(tf.nn.embedding_lookup_sparse(table, _sparse_ids(ids, 3), None, combiner="mean"))
        hist = tf.compat.v1.get_variable("hist", [30, DIM], initializer=_init(99))
        parts.append(tf.nn.safe_embedding_lookup_sparse(hist, features["hist"].to_sparse(), combiner="sqrtn"))
    wide = tf.compat.v1.get_variable("wide", [VOCAB, 1], initializer=_init(50))
    logit = _mlp(tf.concat(parts, axis=1)) + tf.nn.embedding_lookup(wide, features["C0"])
    if optimizer == "adagrad":
        return _head(mode, labels, logit)
    pred = tf.sigmoid(logit)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def raw_model_fn(features, labels, mode):
    return _raw_model(features, labels, mode, "adagrad")


def adam_model_fn(features, labels, mode):
    return _raw_model(features, labels, mode, "adam")


RAW_TABLES = {*(f"deep/raw_C{i}" for i in range(FIELDS)), "deep/hist", "wide"}


def _train(fn, model_dir, steps, warm_start_from=None, hooks=()):
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=_config(), warm_start_from=warm_start_from)
    loss_hook = LossHook()
    est.train(input_fn, steps=steps, hooks=[loss_hook, *hooks])
    return est, np.array(loss_hook.losses)


@pytest.mark.parametrize("fn", [raw_model_fn, adam_model_fn], ids=["adagrad", "adam"])
def test_get_variable_tables_are_packed_and_train_like_the_plain_model_fn(tmp_path, fn):
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    plain, plain_losses = _train(fn, tmp_path / "plain", 40)
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 40, hooks=hooks)
    _assert_losses_close(wrapped_losses, plain_losses)
    report = hooks[0].report
    assert report.packed and not report.skipped and report.unpacked_lookups == []
    assert {m.name for pt in report.plan.packed_tables for m in pt.members} == RAW_TABLES
    stats = hooks[0].stats()
    assert stats["step_ops_packed"] < 0.6 * stats["step_ops_plain"], stats
    # the concatenation of the lookups and the dense layer on it are fused, as in a Keras model
    concats, dense = report.fusions.concats, report.fusions.dense
    assert len(concats) == 1 and concats[0].startswith("concat") and dense == ["dense/MatMul"], report.fusions
    assert "fused 1 concatenation(s) / sum(s) of looked-up fields, 1 dense layer(s) on them" in report.summary()
    # the checkpoint holds the plain variables by their own names, with the same values
    for key in RAW_TABLES:
        np.testing.assert_allclose(wrapped.get_variable_value(key), plain.get_variable_value(key), rtol=1e-4, atol=1e-6)
    if fn is raw_model_fn:
        eval_input = lambda: input_fn(repeat=False).take(5)  # noqa: E731
        np.testing.assert_allclose(wrapped.evaluate(eval_input)["loss"], plain.evaluate(eval_input)["loss"], rtol=1e-5)
        # warm start of the wrapped model_fn from the plain checkpoint equals the plain model_fn's
        warm = tf.estimator.WarmStartSettings(plain.model_dir, vars_to_warm_start="deep/.*")
        _, warm_plain = _train(fn, tmp_path / "warm_plain", 10, warm_start_from=warm)
        _, warm_wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "warm_wrapped", 10, warm_start_from=warm)
        _assert_losses_close(warm_wrapped, warm_plain)


def test_embedding_lookup_sparse_gives_tensorflows_rows_for_any_index_order():
    """Rows up to the last example with ids, zero rows between; ids in any index order are reduced in index order
    (TensorFlow's own reduction refuses them: "segment ids are not increasing")."""

    def make(shuffle):
        def fn(features, labels, mode):
            table = tf.compat.v1.get_variable("t", [VOCAB, DIM], initializer=_init(1))
            sp = _sparse_ids(features["C0"], 4)
            if shuffle:
                order = tf.reverse(tf.range(tf.shape(sp.values)[0]), [0])
                sp = tf.SparseTensor(tf.gather(sp.indices, order), tf.gather(sp.values, order), sp.dense_shape)
            pooled = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum")
            tf.compat.v1.add_to_collection("pooled", pooled)
            return _head(mode, labels, _mlp(pooled))

        return fn

    pooled = {}
    for name, fn in (("plain", make(False)), ("wrapped", htf_estimator.model_fn(make(True)))):
        graph, _, report = _graph_spec(fn)
        with graph.as_default(), tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            (tensor,) = graph.get_collection("pooled")
            pooled[name] = sess.run(tensor)
    assert [m.name for pt in report.plan.packed_tables for m in pt.members] == ["t"]
    assert pooled["plain"].shape == (BATCH, DIM) and not pooled["plain"][1].any() and pooled["plain"][0].any()
    np.testing.assert_allclose(pooled["wrapped"], pooled["plain"], rtol=1e-6)


def test_variables_used_otherwise_stay_plain_and_looked_up_ones_are_named(tmp_path):
    """A dense kernel, a tied table, a table with a get_variable regularizer, a partitioned table: plain variables."""

    def fn(features, labels, mode):
        ok = tf.compat.v1.get_variable("ok", [VOCAB, DIM], initializer=_init(1))
        tied = tf.compat.v1.get_variable("tied", [VOCAB, DIM], initializer=_init(2))
        reg = tf.compat.v1.get_variable(
            "reg", [VOCAB, DIM], initializer=_init(3), regularizer=tf.keras.regularizers.l2(1e-4)
        )
        with tf.compat.v1.variable_scope("parts", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
            parted = tf.compat.v1.get_variable("parted", [VOCAB, DIM], initializer=_init(4))
        kernel = tf.compat.v1.get_variable("kernel", [4 * DIM, 1], initializer=_init(5))
        x = tf.concat(
            [tf.nn.embedding_lookup(t, features[f"C{i}"]) for i, t in enumerate([ok, tied, reg, parted])], axis=1
        )
        logit = tf.matmul(x, kernel) + tf.reduce_sum(tf.matmul(x[:, :DIM], tied, transpose_b=True), 1, keepdims=True)
        pred = tf.sigmoid(logit)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        loss += tf.add_n(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    assert [m.name for pt in report.plan.packed_tables for m in pt.members] == ["ok"]
    assert report.skipped == []
    assert sorted(report.unpacked_lookups) == ["parts/parted/part_0", "parts/parted/part_1", "reg", "tied"]
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(fn, tmp_path / "plain", 60)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 60, hooks=hooks)
    _assert_losses_close(wrapped, plain)


def test_array_initialized_and_reference_tables_pack_frozen_and_control_flow_ones_are_named(tmp_path):
    """A table initialized from an array (no shape=), a reference variable (use_resource=False): packed, exact.
    A frozen table and one looked up inside tf.cond stay plain, each named with its reason (found by a probe)."""

    def fn(features, labels, mode):
        array = np.random.default_rng(3).uniform(-0.1, 0.1, (VOCAB, DIM)).astype(np.float32)
        from_array = tf.compat.v1.get_variable("from_array", initializer=array)
        ref = tf.compat.v1.get_variable("ref", [VOCAB, DIM], initializer=_init(2), use_resource=False)
        frozen = tf.compat.v1.get_variable("frozen", [VOCAB, DIM], initializer=_init(3), trainable=False)
        in_cond = tf.compat.v1.get_variable("in_cond", [VOCAB, DIM], initializer=_init(4))
        ids = [features[f"C{i}"] for i in range(4)]
        parts = [tf.nn.embedding_lookup(t, i) for t, i in zip((from_array, ref, frozen), ids)]
        parts.append(
            tf.cond(
                tf.reduce_any(ids[3] > 0),
                lambda: tf.nn.embedding_lookup(in_cond, ids[3]),
                lambda: tf.zeros([tf.shape(ids[3])[0], DIM]),
            )
        )
        return _head(mode, labels, _mlp(tf.concat(parts, axis=1)))

    _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    assert sorted(m.name for pt in report.plan.packed_tables for m in pt.members) == ["from_array", "ref"]
    skipped = dict(report.skipped)
    assert skipped.keys() == {"frozen", "in_cond"} and report.unpacked_lookups == [], report.summary()
    assert skipped["frozen"].startswith("frozen") and "tf.cond" in skipped["in_cond"]
    plain, plain_losses = _train(fn, tmp_path / "plain", 30)
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 30)
    _assert_losses_close(wrapped_losses, plain_losses)
    assert dict(tf.train.list_variables(wrapped.model_dir)) == dict(tf.train.list_variables(plain.model_dir))
    for key in ("from_array", "ref"):
        np.testing.assert_allclose(wrapped.get_variable_value(key), plain.get_variable_value(key), rtol=1e-4, atol=1e-6)


def test_a_lookup_through_a_list_of_one_table_names_the_fix():
    def fn(features, labels, mode):
        listed = tf.compat.v1.get_variable("listed", [VOCAB, DIM], initializer=_init(1))
        sp = _sparse_ids(features["C1"])
        x = tf.concat(
            [tf.nn.embedding_lookup([listed], features["C0"]), tf.nn.embedding_lookup_sparse([listed], sp, None)], 1
        )
        return _head(mode, labels, _mlp(x))

    _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    assert report.plan is None
    reason = dict(report.skipped)["listed"]
    assert reason.startswith("it is looked up through tf.nn.embedding_lookup(_sparse) as a list")

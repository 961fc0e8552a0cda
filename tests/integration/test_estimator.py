"""hybridtf.estimator: wrapped vs plain model_fn (Estimator train / evaluate / export, MonitoredTrainingSession)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from hybridtf._src.capture.context import CaptureError
from hybridtf._src.capture.layers import EmbeddingBag
from hybridtf._src.capture.lookup_api import TableConfig, Tables, lookup

FIELDS, VOCAB, DIM, BATCH, STEPS = 8, 50, 4, 64, 100
LOSS_KEY = "test_estimator_loss"
TRAIN = tf.estimator.ModeKeys.TRAIN


def _data(n=BATCH * 25, seed=0):
    rng = np.random.default_rng(seed)
    x = {f"C{i}": rng.integers(0, VOCAB - i, size=(n,)).astype(np.int64) for i in range(FIELDS)}
    lengths = rng.integers(0, 5, size=n)
    x["hist_values"] = rng.integers(0, 30, size=int(lengths.sum())).astype(np.int64)
    x["hist_lengths"] = lengths.astype(np.int64)
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    return x, y


DATA = _data()


def _features(x):
    feats = {k: v for k, v in x.items() if not k.startswith("hist_")}
    feats["hist"] = tf.RaggedTensor.from_row_lengths(x["hist_values"], x["hist_lengths"])
    return feats


def input_fn(data=DATA, repeat=True):
    x, y = data
    base = {f"C{i}": x[f"C{i}"] for i in range(FIELDS)}
    hist = tf.RaggedTensor.from_row_lengths(x["hist_values"], x["hist_lengths"])
    ds = tf.data.Dataset.from_tensor_slices(({**base, "hist": hist}, y)).batch(BATCH)
    return ds.repeat() if repeat else ds


def _init(seed):
    return tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=seed)


def _head(mode, labels, logit, optimizer="adagrad"):
    pred = tf.sigmoid(logit)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _mlp(x):
    h = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))(x)
    return tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=8))(h)


def wdl_model_fn(features, labels, mode):
    """Wide & Deep with Keras Embedding layers (deep dim 4, wide dim 1) and a multi-hot EmbeddingBag."""
    deep, wide = [], []
    for i in range(FIELDS):
        ids = features[f"C{i}"]
        deep.append(tf.keras.layers.Embedding(VOCAB - i, DIM, embeddings_initializer=_init(i), name=f"emb_C{i}")(ids))
        wide.append(
            tf.keras.layers.Embedding(VOCAB - i, 1, embeddings_initializer=_init(50 + i), name=f"wide_C{i}")(ids)
        )
    deep.append(EmbeddingBag(30, DIM, combiner="mean", embeddings_initializer=_init(99), name="hist")(features["hist"]))
    logit = _mlp(tf.concat(deep, axis=1)) + tf.add_n(wide)
    return _head(mode, labels, logit)


def tables_model_fn(features, labels, mode):
    """The functional API: Tables created inside the model_fn, one-hot and multi-hot lookups."""
    configs = [TableConfig(f"t{i}", VOCAB - i, DIM, initializer=_init(i)) for i in range(FIELDS)]
    tables = Tables([*configs, TableConfig("hist", 30, DIM, initializer=_init(99))])
    parts = [lookup(tables, f"t{i}", features[f"C{i}"]) for i in range(FIELDS)]
    parts.append(tables.lookup("hist", features["hist"], "sqrtn"))
    return _head(mode, labels, _mlp(tf.concat(parts, axis=1)))


def raw_model_fn(features, labels, mode):
    """Nothing hybridtf can pack: tf.compat.v1.get_variable tables looked up with tf.nn.embedding_lookup, each
    also read as a whole (a use other than lookups: test_estimator_raw_tables packs those looked up only)."""
    parts = []
    for i in range(FIELDS):
        table = tf.compat.v1.get_variable(f"raw_C{i}", [VOCAB, DIM], initializer=_init(i))
        parts.append(tf.nn.embedding_lookup(table, features[f"C{i}"]) + tf.reduce_mean(table))
    return _head(mode, labels, _mlp(tf.concat(parts, axis=1)))


class LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _config():
    return tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )


def _train(fn, model_dir, steps, hooks=(), data=DATA):
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=_config())
    loss_hook = LossHook()
    est.train(lambda: input_fn(data), steps=steps, hooks=[loss_hook, *hooks])
    return est, np.array(loss_hook.losses)


def _assert_losses_close(wrapped, plain, rtol=1e-5):
    assert len(wrapped) == len(plain) > 0
    rel = np.abs(wrapped - plain) / np.maximum(np.abs(plain), 1e-12)
    assert rel.max() < rtol, f"max relative loss difference {rel.max():.3g} at step {int(rel.argmax())}"
    assert abs(plain[-1] - plain[0]) > 1e-3  # it trained


@pytest.fixture(scope="module")
def wdl(tmp_path_factory):
    root = tmp_path_factory.mktemp("wdl")
    stats = htf_estimator.hooks(every_n_steps=50, log_fn=lambda line: None)
    plain, plain_losses = _train(wdl_model_fn, root / "plain", STEPS)
    wrapped, wrapped_losses = _train(htf_estimator.model_fn(wdl_model_fn), root / "wrapped", STEPS, stats)
    return dict(
        root=root, plain=plain, wrapped=wrapped, plain_losses=plain_losses, wrapped_losses=wrapped_losses, stats=stats
    )


def test_wdl_losses_equal_plain_over_100_steps(wdl):
    _assert_losses_close(wdl["wrapped_losses"], wdl["plain_losses"])
    stats = wdl["stats"][0].stats()
    assert stats["packed"] and stats["steps"] == STEPS and stats["examples"] == STEPS * BATCH
    assert stats["step_ops_packed"] < stats["step_ops_plain"]
    report = wdl["stats"][0].report
    assert report.packed_lookups == 2 * FIELDS + 1
    assert {m.name for pt in report.plan.packed_tables for m in pt.members} == {
        *(f"emb_C{i}" for i in range(FIELDS)),
        *(f"wide_C{i}" for i in range(FIELDS)),
        "hist",
    }
    assert report.plan.num_lookup_chains == 2  # dim 4 and dim 1


def test_checkpoint_has_plain_layout(wdl):
    plain = dict(tf.train.list_variables(wdl["plain"].model_dir))
    wrapped = dict(tf.train.list_variables(wdl["wrapped"].model_dir))
    assert wrapped == plain  # same keys (tables and their Adagrad slots per table) and shapes
    assert plain["emb_C3/embeddings/Adagrad"] == [VOCAB - 3, DIM]


def test_evaluate_matches_plain(wdl):
    kwargs = dict(input_fn=lambda: input_fn(repeat=False), steps=5)
    plain, wrapped = wdl["plain"].evaluate(**kwargs), wdl["wrapped"].evaluate(**kwargs)
    assert wrapped["global_step"] == plain["global_step"] == STEPS
    np.testing.assert_allclose(wrapped["loss"], plain["loss"], rtol=1e-5)


def _predict(est, n=3):
    out = est.predict(lambda: input_fn(repeat=False), yield_single_examples=False)
    return np.concatenate([next(out)["p"] for _ in range(n)])


def test_export_saved_model_loads_with_same_predictions(wdl):
    wrapped = wdl["wrapped"]
    expected = _predict(wrapped, 1)

    def serving_input_fn():
        feats = {f"C{i}": tf.compat.v1.placeholder(tf.int64, [None], name=f"C{i}") for i in range(FIELDS)}
        values = tf.compat.v1.placeholder(tf.int64, [None], name="hist_values")
        lengths = tf.compat.v1.placeholder(tf.int64, [None], name="hist_lengths")
        inputs = {**feats, "hist_values": values, "hist_lengths": lengths}
        features = {**feats, "hist": tf.RaggedTensor.from_row_lengths(values, lengths)}
        return tf.estimator.export.ServingInputReceiver(features, inputs)

    path = wrapped.export_saved_model(str(wdl["root"] / "export"), serving_input_fn)
    loaded = tf.saved_model.load(path)
    x, _ = DATA
    batch = {k: tf.constant(v[:BATCH]) for k, v in x.items() if k.startswith("C")}
    lengths = x["hist_lengths"][:BATCH]
    batch["hist_lengths"] = tf.constant(lengths)
    batch["hist_values"] = tf.constant(x["hist_values"][: int(lengths.sum())])
    got = loaded.signatures["serving_default"](**batch)["p"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # PREDICT runs the plain model_fn: its report says so, and the export holds no hybridtf op
    # (it serves without hybridtf)
    _, _, predict_report = _graph_spec(htf_estimator.model_fn(wdl_model_fn), tf.estimator.ModeKeys.PREDICT)
    assert predict_report.packed is False and predict_report.plan is None
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(path.decode() if isinstance(path, bytes) else path) / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].graph_def
    op_types = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    assert not [t for t in op_types if t.startswith("HybridTF")]


def _saved_model_op_types(path):
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(path.decode() if isinstance(path, bytes) else path) / "saved_model.pb").read_bytes())
    return {
        tuple(graph.meta_info_def.tags): {n.op for n in graph.graph_def.node}
        | {n.op for f in graph.graph_def.library.function for n in f.node_def}
        for graph in saved.meta_graphs
    }


def test_eval_and_train_exports_hold_no_hybridtf_op(wdl):
    """``experimental_export_all_saved_models`` builds an EVAL and a TRAIN graph too: they held hybridtf's packed
    ops, so a process without hybridtf could not load them (found by a probe). They run the plain model_fn now,
    over the checkpoint's plain-layout variables, and give the plain model_fn's export's loss."""
    from tensorflow_estimator.python.estimator.export.export import SupervisedInputReceiver

    def supervised_receiver():
        feats = {f"C{i}": tf.compat.v1.placeholder(tf.int64, [None], name=f"C{i}") for i in range(FIELDS)}
        values = tf.compat.v1.placeholder(tf.int64, [None], name="hist_values")
        lengths = tf.compat.v1.placeholder(tf.int64, [None], name="hist_lengths")
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        features = {**feats, "hist": tf.RaggedTensor.from_row_lengths(values, lengths)}
        inputs = {**feats, "hist_values": values, "hist_lengths": lengths, "labels": labels}
        return SupervisedInputReceiver(features, labels, inputs)

    x, y = DATA
    lengths = x["hist_lengths"][:BATCH]
    batch = {f"C{i}": tf.constant(x[f"C{i}"][:BATCH]) for i in range(FIELDS)}
    batch.update(hist_lengths=tf.constant(lengths), hist_values=tf.constant(x["hist_values"][: int(lengths.sum())]))
    batch["labels"] = tf.constant(y[:BATCH])
    losses = {}
    for name in ("plain", "wrapped"):
        modes = {tf.estimator.ModeKeys.EVAL: supervised_receiver, tf.estimator.ModeKeys.TRAIN: supervised_receiver}
        path = wdl[name].experimental_export_all_saved_models(str(wdl["root"] / f"export_all_{name}"), modes)
        ops = _saved_model_op_types(path)
        assert set(ops) == {("eval",), ("train",)}
        hybridtf_ops = {t for op_types in ops.values() for t in op_types if t.startswith("HybridTF")}
        # the plain model_fn computes its EmbeddingBag with hybridtf's ops (this process has them loaded)
        assert bool(hybridtf_ops) == (name == "plain"), hybridtf_ops
        for tag in ("eval", "train"):
            signature = tf.saved_model.load(path, tags=[tag]).signatures[tag]
            inputs = {k: v for k, v in batch.items() if k in signature.structured_input_signature[1]}
            losses[name, tag] = float(signature(**inputs)["loss"])
    for tag in ("eval", "train"):
        np.testing.assert_allclose(losses["wrapped", tag], losses["plain", tag], rtol=1e-6)


def test_wrapped_checkpoint_restores_into_plain_estimator(wdl):
    target = wdl["root"] / "plain_from_wrapped"
    shutil.copytree(wdl["wrapped"].model_dir, target)
    plain = tf.estimator.Estimator(wdl_model_fn, model_dir=str(target), config=_config())
    np.testing.assert_allclose(_predict(plain), _predict(wdl["wrapped"]), rtol=1e-6, atol=1e-7)
    # and it trains on from the wrapped estimator's step, optimizer slots included
    _, losses = _train(wdl_model_fn, target, 2)
    _, wrapped_losses = _train(htf_estimator.model_fn(wdl_model_fn), wdl["wrapped"].model_dir, 2)
    np.testing.assert_allclose(losses, wrapped_losses, rtol=1e-5)


def test_restore_of_a_table_with_another_vocabulary_names_the_entry(wdl, tmp_path):
    """A checkpoint entry of another shape fails the restore naming it (it would resize the packed variable)."""

    def grown_model_fn(features, labels, mode):
        deep, wide = [], []
        for i in range(FIELDS):
            rows = VOCAB - i + (10 if i == 2 else 0)
            ids = features[f"C{i}"]
            deep.append(tf.keras.layers.Embedding(rows, DIM, embeddings_initializer=_init(i), name=f"emb_C{i}")(ids))
            init = _init(50 + i)
            wide.append(tf.keras.layers.Embedding(rows, 1, embeddings_initializer=init, name=f"wide_C{i}")(ids))
        deep.append(EmbeddingBag(30, DIM, combiner="mean", name="hist")(features["hist"]))
        return _head(mode, labels, _mlp(tf.concat(deep, axis=1)) + tf.add_n(wide))

    target = tmp_path / "grown"
    shutil.copytree(wdl["wrapped"].model_dir, target)
    expected = r"(emb|wide)_C2/embeddings\S* is not the model.{1,3}s table of shape \[58, "
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        _train(htf_estimator.model_fn(grown_model_fn), target, 1)


def test_nothing_to_pack_runs_unchanged_and_hooks_say_so(tmp_path):
    lines = []
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lines.append)
    _, plain = _train(raw_model_fn, tmp_path / "plain", 20)
    _, wrapped = _train(htf_estimator.model_fn(raw_model_fn), tmp_path / "wrapped", 20, hooks)
    np.testing.assert_array_equal(wrapped, plain)
    assert "nothing to pack" in lines[0]
    assert "'raw_C0'" in lines[0]  # the unpacked lookups are named
    assert not hooks[0].stats()["packed"] and hooks[0].stats()["examples"] == 20 * BATCH


def test_tables_api_inside_model_fn(tmp_path):
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(tables_model_fn, tmp_path / "plain", 30)
    _, wrapped = _train(htf_estimator.model_fn(tables_model_fn), tmp_path / "wrapped", 30, hooks)
    _assert_losses_close(wrapped, plain)
    report = hooks[0].report
    assert report.packed and report.tables_lookups == FIELDS + 1 and report.plan is None
    assert hooks[0].stats()["step_ops_packed"] < hooks[0].stats()["step_ops_plain"]


def keras_functional_model_fn(features, labels, mode):
    """A functional Keras model built in the model_fn (tf.keras.Input), trained via model.trainable_variables."""
    inputs = {f"C{i}": tf.keras.Input(shape=(), dtype=tf.int64, name=f"C{i}") for i in range(FIELDS)}
    embs = [
        tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=_init(i), name=f"e{i}")(inputs[f"C{i}"])
        for i in range(FIELDS)
    ]
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))(tf.concat(embs, 1))
    model = tf.keras.Model(inputs, out)
    pred = tf.sigmoid(model({k: features[k] for k in inputs}))
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    updates = tf.keras.optimizers.legacy.Adagrad(0.1).get_updates(loss, model.trainable_variables)
    with tf.control_dependencies(updates):
        train_op = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_keras_functional_model_inside_model_fn(tmp_path):
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(keras_functional_model_fn, tmp_path / "plain", 30)
    _, wrapped = _train(htf_estimator.model_fn(keras_functional_model_fn), tmp_path / "wrapped", 30, hooks)
    _assert_losses_close(wrapped, plain)
    assert hooks[0].report.packed_lookups == FIELDS  # the model's call on the features; not the Input pass


def test_out_of_vocabulary_id_names_the_table(tmp_path):
    x, y = _data(BATCH * 2, seed=1)
    x = dict(x)
    x["C2"] = x["C2"].copy()
    x["C2"][5] = VOCAB + 7
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(emb|wide)_C2"):
        _train(htf_estimator.model_fn(wdl_model_fn), tmp_path, 1, data=(x, y))


def _graph_spec(fn, mode=TRAIN):
    """Builds ``fn`` in a fresh graph on one batch; returns (graph, spec, report)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
        spec = fn(features=features, labels=labels, mode=mode)
    return graph, spec, htf_estimator.report_of(graph)


def test_monitored_training_session_with_hooks():
    graph, spec, _ = _graph_spec(htf_estimator.model_fn(wdl_model_fn))
    with graph.as_default():
        counter = tf.compat.v1.get_variable("flushes", [], tf.int64, tf.zeros_initializer(), trainable=False)
        tf.compat.v1.add_to_collection(htf_estimator.CACHE_MAINTENANCE, counter.assign_add(1))
        hooks = htf_estimator.hooks(every_n_steps=None, cache_every_n_steps=4, log_fn=lambda line: None)
        stop = tf.compat.v1.train.StopAtStepHook(last_step=10)
        losses = []
        with tf.compat.v1.train.MonitoredTrainingSession(scaffold=spec.scaffold, hooks=[*hooks, stop]) as sess:
            while not sess.should_stop():
                losses.append(sess.run([spec.train_op, spec.loss])[1])
        stats, cache = hooks[0].stats(), hooks[1]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert stats["steps"] == 10 and stats["examples"] == 10 * BATCH and stats["packed"]
    assert cache.runs == 3  # after steps 4 and 8, and at the end


def test_unsupported_layers_are_reported_not_packed():
    def fn(features, labels, mode):
        reg = tf.keras.layers.Embedding(
            VOCAB, DIM, embeddings_regularizer=lambda w: 1e-3 * tf.reduce_sum(tf.abs(w)), name="with_reg"
        )
        tied = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=_init(3), name="tied")
        ok = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=_init(4), name="ok")
        x = tf.concat([reg(features["C0"]), tied(features["C1"]), ok(features["C2"])], axis=1)
        logit = tf.reduce_sum(tf.matmul(x[:, :DIM], tied.embeddings, transpose_b=True), 1, keepdims=True)
        return _head(mode, labels, logit + _mlp(x))

    _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    skipped = dict(report.skipped)
    assert "regularizer" in skipped["with_reg"] and "used as a tensor" in skipped["tied"]
    assert [m.name for pt in report.plan.packed_tables for m in pt.members] == ["ok"]
    assert "'with_reg'" in report.summary()


def test_a_model_fn_whose_tables_all_stay_unpacked_says_so_with_each_fix():
    """Not "no packable Embedding" when there are Embedding layers, each skipped with its reason (found by a probe)."""

    def fn(features, labels, mode):
        bag = tf.keras.layers.Embedding(VOCAB + 1, DIM, embeddings_initializer=_init(3), name="bag")
        bag.build((None, 1))
        tied = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=_init(4), name="tied")
        ids = tf.sparse.from_dense(tf.cast(features["C0"], tf.int64) + 1)  # no example without an id
        weights = tf.SparseTensor(ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape)
        pooled = tf.nn.embedding_lookup_sparse(bag.embeddings, ids, weights, combiner="mean")
        x = tf.concat([pooled, tf.reshape(tied(features["C1"]), [-1, DIM])], axis=1)
        logit = tf.reduce_sum(tf.matmul(x[:, DIM:], tied.embeddings, transpose_b=True), 1, keepdims=True)
        return _head(mode, labels, logit + _mlp(x))

    _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    skipped = dict(report.skipped)
    assert skipped["bag"].startswith("it is looked up through tf.nn.embedding_lookup_sparse with weighted ids")
    assert "used as a tensor" in skipped["tied"]
    assert report.summary().splitlines()[0] == (
        "hybridtf: nothing packed in this model_fn: its 2 embedding table(s) stay unpacked (each reason below); it "
        "runs unchanged."
    )


def test_partitioned_feature_column_lookups_are_named_in_one_warning(caplog):
    """Feature-column tables pack (test_estimator_feature_columns.py) except partitioned ones, which are named."""

    def fn(features, labels, mode):
        columns = [
            tf.feature_column.embedding_column(tf.feature_column.categorical_column_with_identity(f"C{i}", VOCAB), DIM)
            for i in range(2)
        ]
        ok = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=_init(4), name="ok")
        with tf.compat.v1.variable_scope("parts", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
            deep = tf.compat.v1.feature_column.input_layer(features, columns)
        x = tf.concat([deep, ok(features["C2"])], axis=1)
        return _head(mode, labels, _mlp(x))

    with caplog.at_level("WARNING", logger="hybridtf"):
        _, _, report = _graph_spec(htf_estimator.model_fn(fn))
    assert [m.name for pt in report.plan.packed_tables for m in pt.members] == ["ok"]
    assert len(report.unpacked_lookups) == 4  # two tables of two parts each
    warnings = [r.getMessage() for r in caplog.records if r.name == "hybridtf" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "partitioner" in warnings[0] and "C0_embedding" in warnings[0]


def test_tables_lookup_with_stateful_ids_is_an_error():
    def fn(features, labels, mode):
        tables = Tables([TableConfig("t", VOCAB, DIM)])
        ids = tf.random.uniform([BATCH], 0, VOCAB, tf.int64)
        return _head(mode, labels, _mlp(tables.lookup("t", ids)))

    with pytest.raises(CaptureError, match=r"table 't'.*side effects"):
        _graph_spec(htf_estimator.model_fn(fn))


def test_model_fn_argument_checks():
    with pytest.raises(TypeError, match="callable"):
        htf_estimator.model_fn(42)
    with pytest.raises(ValueError, match="every_n_steps"):
        htf_estimator.hooks(every_n_steps=0)
    assert len(htf_estimator.hooks()) == 2  # no Horovod job: no broadcast hook


@pytest.mark.parametrize("extra_in", ["record", "real"])
def test_a_table_made_in_one_pass_only_is_an_error_naming_it(extra_in):
    """A model_fn that builds another model on another call: a table only the real pass made was trained
    silently as a plain variable (one only the record pass made was already an error)."""
    calls = []

    def model_fn(features, labels, mode):
        calls.append(mode)
        x = tf.keras.layers.Embedding(50, 4, name="emb_user")(features["user"])
        if (len(calls) == 1) == (extra_in == "record"):
            x = x + tf.keras.layers.Embedding(50, 4, name="extra")(features["user"])
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, tf.keras.layers.Dense(1, name="out")(x))
        step = tf.compat.v1.train.get_or_create_global_step()
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step)
        )

    with tf.Graph().as_default():
        features = {"user": tf.constant([1, 2, 3], tf.int64)}
        labels = tf.constant([[0.0], [1.0], [0.0]])
        passes = "the real pass but not in the record pass" if extra_in == "real" else "the record pass but not in"
        with pytest.raises(CaptureError, match=rf"'extra'\]? (was|were) created in {passes}"):
            htf_estimator.model_fn(model_fn)(features, labels, tf.estimator.ModeKeys.TRAIN)


def test_each_model_fn_call_gets_its_own_params(tmp_path):
    """A model_fn that changes its params (pop, in-place defaults) builds the same graph wrapped as plain."""

    def input_fn():
        rng = np.random.default_rng(0)
        x = {"user": rng.integers(0, 50, 64)}
        return tf.data.Dataset.from_tensor_slices((x, (rng.random((64, 1)) < 0.3).astype(np.float32))).batch(32)

    def model_fn(features, labels, mode, params):
        dim = params.pop("dim")
        params.setdefault("hidden", []).append(8)
        x = tf.keras.layers.Embedding(50, dim, name="emb_user")(features["user"])
        for k, n in enumerate(params["hidden"]):
            x = tf.keras.layers.Dense(n, "relu", name=f"hidden{k}")(x)
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, tf.keras.layers.Dense(1, name="out")(x))
        step = tf.compat.v1.train.get_global_step()
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step)
        )

    names = []
    for label, fn in (("plain", model_fn), ("wrapped", htf_estimator.model_fn(model_fn))):
        tf.estimator.Estimator(fn, model_dir=str(tmp_path / label), params={"dim": 4}).train(input_fn, steps=2)
        names.append(sorted(k for k, _ in tf.train.list_variables(str(tmp_path / label)) if "Adagrad" not in k))
    assert names[0] == names[1] and "hidden1/kernel" not in names[1]


def test_a_keras_legacy_optimizers_slots_are_saved_per_table(tmp_path):
    """``tf.keras.optimizers.legacy.Adam`` in a model_fn names its slots <optimizer>/<variable>/<slot>."""

    def input_fn():
        rng = np.random.default_rng(0)
        x = {"user": rng.integers(0, 50, 64), "item": rng.integers(0, 40, 64)}
        return tf.data.Dataset.from_tensor_slices((x, (rng.random((64, 1)) < 0.3).astype(np.float32))).batch(32)

    def model_fn(features, labels, mode):
        u = tf.keras.layers.Embedding(50, 4, name="emb_user")(features["user"])
        i = tf.keras.layers.Embedding(40, 4, name="emb_item")(features["item"])
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(
            labels, tf.keras.layers.Dense(1, name="out")(tf.concat([u, i], 1))
        )
        variables = tf.compat.v1.trainable_variables()
        updates = tf.keras.optimizers.legacy.Adam(0.01).get_updates(loss, variables)
        step = tf.compat.v1.train.get_global_step()
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(*updates, step.assign_add(1)))

    keys = []
    for label, fn in (("plain", model_fn), ("wrapped", htf_estimator.model_fn(model_fn))):
        tf.estimator.Estimator(fn, model_dir=str(tmp_path / label)).train(input_fn, steps=2)
        keys.append(dict(tf.train.list_variables(str(tmp_path / label))))
    assert keys[1] == keys[0] and keys[0]["Adam/emb_user/embeddings/m"] == [50, 4]
    tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "wrapped")).train(input_fn, steps=1)  # plain resumes


def test_an_error_in_the_copied_id_ops_names_their_own_layer(tmp_path):
    """The ids' ops are copied into the step at the first lookup, for every table: a copy keeps its source's full
    name, so a string feature fed to a Keras Embedding names that layer's ``Cast`` (as the plain model_fn's
    error does), not the first layer's scope."""

    def string_c2_input_fn():
        return input_fn().map(lambda f, y: ({**f, "C2": tf.strings.as_string(f["C2"])}, y))

    est = tf.estimator.Estimator(htf_estimator.model_fn(wdl_model_fn), model_dir=str(tmp_path), config=_config())
    with pytest.raises(tf.errors.UnimplementedError, match=r"node hybridtf_ids\w*/(\w+/)*(emb|wide)_C2/Cast"):
        est.train(string_c2_input_fn, steps=1)


def test_parquet_dataset_feeds_an_estimator_exactly(tmp_path):
    """hybridtf.data.parquet_dataset as the input_fn (built inside the Estimator's graph): wrapped == plain."""
    from hybridtf import data as hd

    x, y = DATA
    spec = hd.FeatureSpec(label="label", one_hot=[f"C{i}" for i in range(FIELDS)], multi_hot=["hist"])
    bags = np.split(x["hist_values"], np.cumsum(x["hist_lengths"])[:-1])
    path = str(tmp_path / "train.parquet")
    hd.write_parquet(path, {"label": y[:, 0], **{f"C{i}": x[f"C{i}"] for i in range(FIELDS)}, "hist": bags}, spec)

    def parquet_input_fn():
        ds = hd.parquet_dataset(path, spec=spec, batch_size=BATCH, shuffle=True, seed=4)
        return ds.map(lambda f, label: (f, label[:, None])).repeat()

    losses = {}
    for name, fn in (("plain", wdl_model_fn), ("wrapped", htf_estimator.model_fn(wdl_model_fn))):
        est = tf.estimator.Estimator(fn, model_dir=str(tmp_path / name), config=_config())
        hook = LossHook()
        est.train(parquet_input_fn, steps=30, hooks=[hook])
        losses[name] = np.array(hook.losses)
    _assert_losses_close(losses["wrapped"], losses["plain"])

"""Dynamic (HybridHash) tables in ``hybridtf.estimator.model_fn``: exact training, checkpoints, hooks, bad input.

The backbone: a model_fn with a ``DynamicEmbedding`` (or a ``Tables`` dynamic
table) trained by a ``tf.compat.v1.train`` optimizer hooked by
``dynamic_optimizer`` gives the same per-step losses (1e-5 relative, fp32) as
the plain model_fn whose ``tf.keras.layers.Embedding`` starts from the same
deterministic per-id rows, with Algorithm 1's flushes (and the hook's) during
the run; training that stops and resumes from the Estimator's checkpoint is
bit-identical to training without a stop.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.estimator as htf_estimator
from hybridtf._src.caching.dynamic_table import DynamicTableConfig
from hybridtf._src.capture.context import CaptureError

V, D, BATCH, SEED = 64, 8, 32, 1234
TRAIN = tf.estimator.ModeKeys.TRAIN
LOSS_KEY = "test_estimator_dynamic_loss"
TABLE = dict(hot_rows=16, warmup_steps=5, flush_every=7, seed=SEED)


def _data(batches, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1) ** 1.1  # Zipf-like: the hot tier matters
    x = rng.choice(V, size=(batches * BATCH, 2), p=p / p.sum()).astype(np.int64)
    y = (rng.random((batches * BATCH, 1)) < 0.4).astype(np.float32)
    return x, y


DATA = _data(60)
INIT_ROWS = htf.layers.DynamicEmbedding(D, name="init_rows", seed=SEED).initial_rows(np.arange(V)).numpy()


def _input_fn(first_batch=0):
    x, y = DATA
    x, y = x[first_batch * BATCH :], y[first_batch * BATCH :]
    return tf.data.Dataset.from_tensor_slices(({"a": x[:, 0], "b": x[:, 1]}, y)).batch(BATCH)


def _head(mode, labels, embedded, optimizer):
    h = tf.keras.layers.Flatten()(embedded)
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h)
    pred = tf.sigmoid(logit)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _v1(kind):
    return {
        "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.2),
        "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
        "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    }[kind]()


def _ids(features):
    return tf.stack([features["a"], features["b"]], axis=1)


def dynamic_model_fn(features, labels, mode, params):
    layer = htf.layers.DynamicEmbedding(params.get("dim", D), name=params.get("name", "items"), **TABLE)
    emb = layer(_ids(features), training=mode == TRAIN)
    opt = _v1(params["kind"])
    if params.get("hook", True):
        opt = htf.keras.dynamic_optimizer(opt)
    return _head(mode, labels, emb, opt)


def tables_model_fn(features, labels, mode, params):
    tables = htf.embedding.Tables([DynamicTableConfig("items", D, **TABLE)])
    emb = tables.lookup("items", _ids(features), training=mode == TRAIN)
    return _head(mode, labels, emb, htf.keras.dynamic_optimizer(_v1(params["kind"])))


def plain_model_fn(features, labels, mode, params):
    init = tf.keras.initializers.Constant(INIT_ROWS)
    emb = tf.keras.layers.Embedding(V, D, embeddings_initializer=init, name="items")(_ids(features))
    return _head(mode, labels, emb, _v1(params["kind"]))


class LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _estimator(fn, model_dir, **params):
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    return tf.estimator.Estimator(fn, model_dir=str(model_dir), config=config, params=params)


def _train(est, steps, first_batch=0, hooks=()):
    losses = LossHook()
    est.train(lambda: _input_fn(first_batch), steps=steps, hooks=[losses, *hooks])
    return np.array(losses.losses)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """40 Adagrad steps of the wrapped dynamic model_fn with hybridtf's hooks, and their losses."""
    model_dir = tmp_path_factory.mktemp("dyn_full")
    lines = []
    hooks = htf_estimator.hooks(every_n_steps=10, cache_every_n_steps=9, log_fn=lines.append)
    est = _estimator(htf_estimator.model_fn(dynamic_model_fn), model_dir, kind="adagrad")
    losses = _train(est, 40, hooks=hooks)
    return model_dir, losses, hooks, lines


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """The same 40 steps of the plain model_fn (an Embedding started from the same rows)."""
    model_dir = tmp_path_factory.mktemp("plain_full")
    return model_dir, _train(_estimator(plain_model_fn, model_dir, kind="adagrad"), 40)


def test_dynamic_embedding_model_fn_equals_plain_embedding(uninterrupted, plain_run):
    model_dir, losses, _, _ = uninterrupted
    tmp_path, plain = plain_run
    assert len(losses) == 40
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
    # the learned rows are the plain model's rows (the checkpoint holds the table's export)
    ids = tf.train.load_variable(str(model_dir), "hybridtf_dynamic/items/ids")
    rows = tf.train.load_variable(str(model_dir), "hybridtf_dynamic/items/rows")
    slots = tf.train.load_variable(str(model_dir), "hybridtf_dynamic/items/slots")
    np.testing.assert_array_equal(ids, np.unique(DATA[0][: 40 * BATCH]))
    np.testing.assert_allclose(rows, tf.train.load_variable(str(tmp_path), "items/embeddings")[ids], rtol=1e-5)
    accum = tf.train.load_variable(str(tmp_path), "items/embeddings/Adagrad")[ids]
    np.testing.assert_allclose(slots.reshape(accum.shape), accum, rtol=1e-5)
    # the buffers are not checkpointed; the table is
    names = [n for n, _ in tf.train.list_variables(str(model_dir))]
    assert not [n for n in names if "distinct_rows" in n or n.endswith("_ids")]


def test_stats_hook_reports_and_cache_hook_flushes(uninterrupted):
    _, _, hooks, lines = uninterrupted
    stats_hook = next(h for h in hooks if isinstance(h, htf_estimator.StatsHook))
    cache_hook = next(h for h in hooks if isinstance(h, htf_estimator.CacheMaintenanceHook))
    m = stats_hook.stats()["dynamic_tables"]["items"]
    assert m["size"] == m["inserts"] == len(np.unique(DATA[0][: 40 * BATCH]))
    assert m["evictions"] == 0 and m["step"] == 40 and m["hot_used"] == 16
    assert 0 < m["hit_ratio"] <= 1 and 0 < m["hit_ratio_cumulative"] < 1
    # Algorithm 1's flushes (steps 7, 14, ..., 35 after warm-up 5) plus the hook's (after steps 9, 18, 27, 36;
    # its flush at the end comes after StatsHook's last read)
    assert cache_hook.runs == 5 and m["flushes"] == 5 + 4
    assert any("dynamic table 'items': hit ratio" in line for line in lines)
    assert any("dynamic (HybridHash) table(s): 'items'" in line for line in lines)


def test_resume_from_checkpoint_is_bit_identical(uninterrupted, tmp_path):
    model_dir, losses, _, _ = uninterrupted
    est = _estimator(htf_estimator.model_fn(dynamic_model_fn), tmp_path, kind="adagrad")
    first = _train(est, 20)
    second = _train(est, 20, first_batch=20)
    np.testing.assert_array_equal(np.concatenate([first, second]), losses)
    for field in ("ids", "rows", "slots", "counts", "step"):
        key = f"hybridtf_dynamic/items/{field}"
        resumed, full = (tf.train.load_variable(str(d), key) for d in (tmp_path, model_dir))
        np.testing.assert_array_equal(resumed, full)


@pytest.mark.parametrize("fn, kind", [(tables_model_fn, "adam"), (dynamic_model_fn, "sgd")])
def test_tables_api_and_other_optimizers_equal_plain(fn, kind, tmp_path):
    dyn = _train(_estimator(htf_estimator.model_fn(fn), tmp_path / "dyn", kind=kind), 15)
    plain = _train(_estimator(plain_model_fn, tmp_path / "plain", kind=kind), 15)
    np.testing.assert_allclose(dyn, plain, rtol=1e-5)


def test_evaluate_equals_plain(uninterrupted, plain_run):
    model_dir, _, _, _ = uninterrupted
    est = _estimator(htf_estimator.model_fn(dynamic_model_fn), model_dir, kind="adagrad")
    plain_dir = plain_run[0]
    ev = est.evaluate(lambda: _input_fn(40), steps=5)
    ev_plain = _estimator(plain_model_fn, plain_dir, kind="adagrad").evaluate(lambda: _input_fn(40), steps=5)
    np.testing.assert_allclose(ev["loss"], ev_plain["loss"], rtol=1e-5)


def test_unhooked_optimizer_unset_training_and_wrong_ids_are_clear_errors(tmp_path):
    est = _estimator(htf_estimator.model_fn(dynamic_model_fn), tmp_path / "a", kind="adagrad", hook=False)
    with pytest.raises(ValueError, match=r"'items' is trained by optimizer AdagradOptimizer, which is not hooked"):
        _train(est, 1)

    def no_training(features, labels, mode, params):
        emb = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(_ids(features))
        return _head(mode, labels, emb, htf.keras.dynamic_optimizer(_v1("adagrad")))

    with pytest.raises(CaptureError, match=r"'items' is only read.*training=\(mode == tf.estimator.ModeKeys.TRAIN\)"):
        _train(_estimator(htf_estimator.model_fn(no_training), tmp_path / "b"), 1)

    def float_ids(features, labels, mode, params):
        ids = tf.cast(_ids(features), tf.float32)
        emb = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(ids, training=True)
        return _head(mode, labels, emb, htf.keras.dynamic_optimizer(_v1("adagrad")))

    with pytest.raises(TypeError, match=r"'items'.*ids must be int64.*Fix"):
        _train(_estimator(htf_estimator.model_fn(float_ids), tmp_path / "c"), 1)


@pytest.mark.parametrize("fn", [dynamic_model_fn, tables_model_fn], ids=["layer", "tables"])
def test_an_unwrapped_model_fn_with_a_dynamic_table_is_refused(fn, tmp_path):
    # It would train, but the Estimator's checkpoints would not hold the table: the next call starts afresh.
    est = _estimator(fn, tmp_path, kind="adagrad")
    with pytest.raises(CaptureError, match=r"'items' is looked up in a TF1 graph.*estimator.model_fn\(model_fn"):
        _train(est, 1)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_restore_into_model_with_other_tables_names_them(uninterrupted, tmp_path):
    model_dir, _, _, _ = uninterrupted
    renamed = _estimator(htf_estimator.model_fn(dynamic_model_fn), model_dir, kind="adagrad", name="users")
    with pytest.raises(ValueError, match=r"\['users'\] are not in it.*\['items'\].*new model_dir"):
        _train(renamed, 1, first_batch=40)
    wider = _estimator(htf_estimator.model_fn(dynamic_model_fn), model_dir, kind="adagrad", dim=D + 1)
    with pytest.raises(ValueError, match=r"'items' has dim 8 there but 9"):
        _train(wider, 1, first_batch=40)


def test_v1_optimizer_settings_without_a_fused_update_are_refused(tmp_path):
    def fn(features, labels, mode, params):
        emb = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(_ids(features), training=True)
        return _head(mode, labels, emb, htf.keras.dynamic_optimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)))

    with pytest.raises(ValueError, match=r"GradientDescentOptimizer, AdagradOptimizer or AdamOptimizer.*Momentum"):
        _train(_estimator(htf_estimator.model_fn(fn), tmp_path), 1)


def test_a_keras_optimizer_for_dynamic_tables_in_a_model_fn_is_refused_naming_the_v1_ones(tmp_path):
    """A TF1 graph has no automatic control dependencies: its update read the empty buffer (a raw segment_ids
    error at the first step)."""

    def fn(features, labels, mode, params):
        emb = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(_ids(features), training=mode == TRAIN)
        h = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(emb))
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(h)))
        opt = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1))
        variables = tf.compat.v1.trainable_variables()
        train_op = opt.apply_gradients(zip(tf.gradients(loss, variables), variables))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with pytest.raises(ValueError, match=r"\['items'\] in a TF1 graph .* not with the Keras optimizer Adagrad"):
        _train(_estimator(htf_estimator.model_fn(fn), tmp_path), 1)


@pytest.mark.parametrize("fn", ["layer", "tables"])
def test_exported_saved_model_serves_the_learned_rows_without_hybridtf(uninterrupted, tmp_path, fn):
    """PREDICT graphs read the checkpoint's ids and rows with plain TF ops: no hybridtf op, zeros for unseen ids."""
    import subprocess
    import sys

    model_dir, _, _, _ = uninterrupted
    est = _estimator(
        htf_estimator.model_fn(dynamic_model_fn if fn == "layer" else tables_model_fn), model_dir, kind="adagrad"
    )

    def serving_input_fn():
        a, b = (tf.compat.v1.placeholder(tf.int64, [None], name=n) for n in "ab")
        return tf.estimator.export.ServingInputReceiver({"a": a, "b": b}, {"a": a, "b": b})

    export = est.export_saved_model(str(tmp_path), serving_input_fn).decode()
    assert b"HybridTF" not in open(f"{export}/saved_model.pb", "rb").read()
    x = np.concatenate([DATA[0][:6], [[2**62, 5]]])  # an id never seen: the zero row
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
        f"f = tf.saved_model.load({export!r}).signatures['serving_default']\n"
        "p = f(a=tf.constant(x[:, 0]), b=tf.constant(x[:, 1]))['p'].numpy()\n"
        f"np.save({str(tmp_path / 'p.npy')!r}, p)\n"
        "assert 'hybridtf' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    served = np.load(tmp_path / "p.npy").ravel()
    # the model the checkpoint holds, computed from its variables
    ckpt = tf.train.latest_checkpoint(str(model_dir))
    load = lambda name: tf.train.load_variable(ckpt, name)  # noqa: E731
    ids, rows = load("hybridtf_dynamic/items/ids"), load("hybridtf_dynamic/items/rows")
    lookup = {int(i): r for i, r in zip(ids, rows)}
    emb = np.array([np.concatenate([lookup.get(int(i), np.zeros(D, np.float32)) for i in row]) for row in x])
    h = np.maximum(emb @ load("dense/kernel") + load("dense/bias"), 0)
    expected = 1 / (1 + np.exp(-(h @ load("dense_1/kernel") + load("dense_1/bias")))).ravel()
    assert 2**62 not in lookup and 5 in lookup
    np.testing.assert_allclose(served, expected, rtol=1e-5)
    # Estimator.predict builds the same PREDICT graph: the same rows
    predicted = np.concatenate(
        [p["p"] for p in est.predict(lambda: tf.data.Dataset.from_tensors({"a": x[:, 0], "b": x[:, 1]}))]
    )
    np.testing.assert_allclose(predicted.ravel(), served, rtol=1e-6)


def test_predict_without_a_checkpoint_serves_zero_rows(tmp_path):
    """No checkpoint (Estimator initializes the variables): the table has no rows, every id gets the zero row."""
    est = _estimator(htf_estimator.model_fn(dynamic_model_fn), tmp_path, kind="adagrad")
    x = DATA[0][:4]
    predicted = np.concatenate(
        [p["p"] for p in est.predict(lambda: tf.data.Dataset.from_tensors({"a": x[:, 0], "b": x[:, 1]}))]
    )
    # the head's initial weights, as the plain model_fn (same seeds) predicts from zero rows
    zeros = tf.keras.initializers.Zeros()

    def zero_rows_fn(features, labels, mode, params):
        emb = tf.keras.layers.Embedding(V, D, embeddings_initializer=zeros, name="items")(_ids(features))
        return _head(mode, labels, emb, None)

    expected = np.concatenate(
        [
            p["p"]
            for p in _estimator(zero_rows_fn, tmp_path / "plain", kind="adagrad").predict(
                lambda: tf.data.Dataset.from_tensors({"a": x[:, 0], "b": x[:, 1]})
            )
        ]
    )
    np.testing.assert_allclose(predicted, expected, rtol=1e-6)


def test_tf1_checkpoint_entry_of_another_table_is_refused(tmp_path):
    from hybridtf._src.integrations.estimator_dynamic import TableSaveable

    users = htf.layers.DynamicEmbedding(D, name="users", hot_rows=4)
    users.build(None)
    users.table.lookup(tf.constant([1, 2], tf.int64))
    fields = ("ids", "rows", "slots", "counts", "slot_init", "step", "table_name")
    prefix = str(tmp_path / "ckpt")  # table 'users' written under table 'items' keys
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[f"hybridtf_dynamic/items/{f}" for f in fields],
        shape_and_slices=[""] * len(fields),
        tensors=[*users.table.export(), tf.constant("users")],
    )
    with tf.Graph().as_default():
        items = htf.layers.DynamicEmbedding(D, name="items", hot_rows=4)
        items.build(None)
        saver = tf.compat.v1.train.Saver([TableSaveable(items.table)])
        with tf.compat.v1.Session() as sess:
            with pytest.raises(
                tf.errors.InvalidArgumentError, match=r"items\W+: the checkpoint entry holds another table"
            ):
                saver.restore(sess, prefix)


def _warm_estimator(model_dir, warm_start, **params):
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=None, log_step_count_steps=None)
    return tf.estimator.Estimator(
        htf_estimator.model_fn(dynamic_model_fn),
        model_dir=str(model_dir),
        config=config,
        params={"kind": "adagrad", **params},
        warm_start_from=warm_start,
    )


def test_warm_start_imports_the_dynamic_tables(uninterrupted, tmp_path):
    model_dir, _, _, _ = uninterrupted
    load = tf.train.load_variable
    _train(_warm_estimator(tmp_path / "all", str(model_dir)), 1, first_batch=40)
    assert load(str(tmp_path / "all"), "hybridtf_dynamic/items/step") == 41  # went on from step 40
    old_ids, old_rows = (load(str(model_dir), f"hybridtf_dynamic/items/{f}") for f in ("ids", "rows"))
    ids, rows = (load(str(tmp_path / "all"), f"hybridtf_dynamic/items/{f}") for f in ("ids", "rows"))
    untouched = np.setdiff1d(old_ids, DATA[0][40 * BATCH : 41 * BATCH])
    assert set(old_ids) <= set(ids) and len(untouched) > 0
    np.testing.assert_array_equal(rows[np.searchsorted(ids, untouched)], old_rows[np.searchsorted(old_ids, untouched)])
    # a second train() restores its own checkpoint, not the warm start
    _train(_warm_estimator(tmp_path / "all", str(model_dir)), 1, first_batch=41)
    assert load(str(tmp_path / "all"), "hybridtf_dynamic/items/step") == 42

    dense_only = tf.estimator.WarmStartSettings(str(model_dir), vars_to_warm_start="dense.*")
    _train(_warm_estimator(tmp_path / "dense", dense_only), 1, first_batch=40)
    assert load(str(tmp_path / "dense"), "hybridtf_dynamic/items/step") == 1  # not selected: started empty

    renamed = _warm_estimator(tmp_path / "renamed", str(model_dir), name="users")
    with pytest.raises(ValueError, match=r"'users' is selected but .* no 'hybridtf_dynamic/users'.*\['items'\]"):
        _train(renamed, 1)
    mapped = tf.estimator.WarmStartSettings(
        str(model_dir), var_name_to_prev_var_name={"hybridtf_dynamic/users": "hybridtf_dynamic/items"}
    )
    _train(_warm_estimator(tmp_path / "mapped", mapped, name="users"), 1, first_batch=40)
    assert load(str(tmp_path / "mapped"), "hybridtf_dynamic/users/step") == 41


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_warm_start_equals_the_plain_model_fn_warm_started_the_same_way(kind, tmp_path):
    """A regex (a path's default ".*") warm-starts TensorFlow's trainable variables only: a dynamic table's rows,
    not its optimizer slots (they were imported: 3.4% from the plain model_fn under Adam); a list of names
    warm-starts the slots too, as it does the plain table's slot variables."""
    sources = {}
    fns = {"plain": plain_model_fn, "dynamic": htf_estimator.model_fn(dynamic_model_fn)}
    for name, fn in fns.items():
        sources[name] = tmp_path / f"source_{name}"
        _train(_estimator(fn, sources[name], kind=kind), 8)
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=None, log_step_count_steps=None)
    for how in ("path", "list"):
        losses = {}
        for name, fn in fns.items():
            source = str(sources[name])
            warm = source if how == "path" else tf.estimator.WarmStartSettings(source, vars_to_warm_start=[".*"])
            est = tf.estimator.Estimator(
                fn, str(tmp_path / f"{how}_{name}"), config=config, params={"kind": kind}, warm_start_from=warm
            )
            losses[name] = _train(est, 8, first_batch=8)
        np.testing.assert_allclose(losses["dynamic"], losses["plain"], rtol=1e-5, atol=0, err_msg=how)


def mixed_model_fn(features, labels, mode, params):
    """A packed static Embedding next to a DynamicEmbedding (hybridtf's own Saver writes both)."""
    init = tf.keras.initializers.Constant(INIT_ROWS)
    static = tf.keras.layers.Embedding(V, D, embeddings_initializer=init, name="static")(features["a"])
    if params.get("plain"):
        dyn = tf.keras.layers.Embedding(V, D, embeddings_initializer=init, name="items")(features["b"])
        opt = _v1("adagrad")
    else:
        dyn = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(features["b"], training=mode == TRAIN)
        opt = htf.keras.dynamic_optimizer(_v1("adagrad"))
    return _head(mode, labels, tf.stack([static, dyn], axis=1), opt)


def test_packed_static_table_next_to_a_dynamic_one(tmp_path):
    plain = _train(_estimator(mixed_model_fn, tmp_path / "plain", plain=True), 12)
    full = _train(_estimator(htf_estimator.model_fn(mixed_model_fn), tmp_path / "full"), 12)
    np.testing.assert_allclose(full, plain, rtol=1e-5)
    est = _estimator(htf_estimator.model_fn(mixed_model_fn), tmp_path / "resumed")
    resumed = np.concatenate([_train(est, 6), _train(est, 6, first_batch=6)])
    np.testing.assert_array_equal(resumed, full)
    names = {n for n, _ in tf.train.list_variables(str(tmp_path / "resumed"))}
    assert {"static/embeddings", "static/embeddings/Adagrad", "hybridtf_dynamic/items/rows"} <= names


def table_only_model_fn(features, labels, mode, params):
    """No dense layer: the dynamic table is the only trainable state (TF1 Adam's beta powers come from us)."""
    if params.get("plain"):
        init = tf.keras.initializers.Constant(INIT_ROWS)
        emb = tf.keras.layers.Embedding(V, D, embeddings_initializer=init, name="items")(_ids(features))
        opt = _v1("adam")
    else:
        emb = htf.layers.DynamicEmbedding(D, name="items", **TABLE)(_ids(features), training=mode == TRAIN)
        opt = htf.keras.dynamic_optimizer(_v1("adam"))
    pred = tf.sigmoid(tf.reduce_sum(emb, axis=[1, 2])[:, None])
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_adam_with_only_dynamic_tables_equals_plain(tmp_path):
    dyn = _train(_estimator(htf_estimator.model_fn(table_only_model_fn), tmp_path / "dyn"), 12)
    plain = _train(_estimator(table_only_model_fn, tmp_path / "plain", plain=True), 12)
    np.testing.assert_allclose(dyn, plain, rtol=1e-5)
    assert tf.train.load_variable(str(tmp_path / "dyn"), "global_step") == 12


def micro_batched_model_fn(features, labels, mode, params):
    """The dynamic model_fn's math, its gradients from htf.micro_batch_gradients over 4 micro-batches."""
    layer = htf.layers.DynamicEmbedding(D, name="items", **TABLE)
    hidden = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))

    def loss_fn(batch):
        ids, y = batch
        pred = tf.sigmoid(out(hidden(tf.keras.layers.Flatten()(layer(ids, training=True)))))
        return tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, pred))

    loss, grads, variables = htf.micro_batch_gradients(loss_fn, (_ids(features), labels), micro_batches=4)
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    opt = htf.keras.dynamic_optimizer(_v1("adagrad"))
    train_op = opt.apply_gradients(zip(grads, variables), global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_micro_batch_gradients_over_a_dynamic_table_equal_the_whole_batch(uninterrupted, tmp_path):
    """Each micro-batch's lookup appends to the layer's buffer (TF1 graph: explicit dependencies), one update."""
    est = _estimator(htf_estimator.model_fn(micro_batched_model_fn), tmp_path, kind="adagrad")
    np.testing.assert_allclose(_train(est, 20), uninterrupted[1][:20], rtol=1e-5)


def test_adam_train_calls_that_run_their_input_to_the_end_equal_plain(tmp_path):
    """Each train call ends with the step that finds the end of its input: the plain model_fn's TF1 Adam decays
    every row's moments there (data-free ops still run), and so do the dynamic tables before the last checkpoint
    of the call; periodic checkpoints in between (every 4 steps) change nothing."""

    def calls(fn, model_dir, **params):
        config = tf.estimator.RunConfig(
            tf_random_seed=1, save_checkpoints_steps=4, save_summary_steps=None, log_step_count_steps=None
        )
        est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=config, params=params)
        losses = []
        for call in range(3):  # 10, 10 and 7 batches, steps=None: every call meets the end of its input
            hook = LossHook()
            est.train(lambda c=call: _input_fn(10 * c).take(10 if c < 2 else 7), steps=None, hooks=[hook])
            losses += hook.losses
        return np.array(losses)

    dyn = calls(htf_estimator.model_fn(dynamic_model_fn), tmp_path / "dyn", kind="adam")
    plain = calls(plain_model_fn, tmp_path / "plain", kind="adam")
    assert len(dyn) == 27 and tf.train.load_variable(str(tmp_path / "dyn"), "global_step") == 27
    np.testing.assert_allclose(dyn, plain, rtol=1e-5)
    ids = tf.train.load_variable(str(tmp_path / "dyn"), "hybridtf_dynamic/items/ids")
    slots = tf.train.load_variable(str(tmp_path / "dyn"), "hybridtf_dynamic/items/slots")
    m = tf.train.load_variable(str(tmp_path / "plain"), "items/embeddings/Adam")
    np.testing.assert_allclose(slots[:, 0], m[ids], rtol=1e-4, atol=1e-7)  # slots: [rows, (m, v), dim]

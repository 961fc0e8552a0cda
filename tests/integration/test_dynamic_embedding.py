"""DynamicEmbedding (HybridHash) trains exactly like a Keras Embedding, on unbounded ids, and checkpoints.

The backbone: ids in [0, V), 100 steps, flushes during the run; a model with
DynamicEmbedding and a plain Keras model whose Embedding rows are the
DynamicEmbedding's deterministic initial rows agree in every per-step loss
within 1e-5 relative (fp32), for every fused optimizer.
"""

from __future__ import annotations

import csv
import logging
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

V, D, FIELDS, BATCH, STEPS = 64, 8, 3, 32, 100
_HERE = pathlib.Path(__file__).resolve()
# ../shared/data beside the checkout (also from a worktree one level deeper)
DATA = next(
    (p / "shared" / "data" / "avazu_sample.txt" for p in _HERE.parents[3:5] if (p / "shared" / "data").is_dir()),
    _HERE.parents[3] / "shared" / "data" / "avazu_sample.txt",
)


def _data(steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1) ** 1.1  # Zipf-like, so the hot tier matters
    x = rng.choice(V, size=(steps * BATCH, FIELDS), p=p / p.sum()).astype(np.int64)
    y = rng.normal(size=(steps * BATCH, 1)).astype(np.float32)
    return x, y


def _model(embedding, combiner_input=False):
    ids = tf.keras.Input((FIELDS,), dtype=tf.int64)
    e = embedding(ids)
    h = e if combiner_input else tf.keras.layers.Flatten()(e)
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h)
    return tf.keras.Model(ids, out)


class _Losses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])


def _optimizer(kind):
    return {
        "sgd": lambda: tf.keras.optimizers.SGD(0.1),
        "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
        "adam": lambda: tf.keras.optimizers.Adam(0.01),
        "lazy_adam": lambda: htf.keras.LazyAdam(0.01),
    }[kind]()


def _fit(model, x, y, callbacks=()):
    losses = _Losses()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[*callbacks, losses])
    return np.array(losses.losses)


def _pair(kind, combiner=None, **table):
    dyn = htf.layers.DynamicEmbedding(D, combiner=combiner, name="items", **table)
    m1 = _model(dyn, combiner is not None)
    init = dyn.initial_rows(np.arange(V)).numpy()
    const = tf.keras.initializers.Constant(init)
    if combiner is None:
        plain = tf.keras.layers.Embedding(V, D, embeddings_initializer=const)
    else:
        plain = htf.layers.EmbeddingBag(V, D, combiner=combiner, embeddings_initializer=const)
    m2 = _model(plain, combiner is not None)
    m1.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer(kind)), loss="mse")
    m2.compile(optimizer=_optimizer(kind), loss="mse")
    return dyn, m1, m2


@pytest.mark.parametrize("kind, steps", [("adagrad", STEPS), ("adam", STEPS), ("sgd", 40), ("lazy_adam", 40)])
def test_dynamic_embedding_equals_keras_embedding(kind, steps):
    x, y = _data(steps)
    dyn, m1, m2 = _pair(kind, hot_rows=16, warmup_steps=10, flush_every=7)
    l1 = _fit(m1, x, y)
    l2 = _fit(m2, x, y)
    assert len(l1) == steps
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    stats = dyn.stats()
    assert stats["flushes"] >= (steps - 10) // 7 and stats["hot_used"] == 16 and stats["step"] == steps
    assert stats["size"] == len(np.unique(x))
    assert 0 < stats["hits"] < stats["lookups"]
    # the learned rows are the plain model's rows
    ids, rows = dyn.table.export()[:2]
    np.testing.assert_allclose(rows.numpy(), m2.layers[1].embeddings.numpy()[ids.numpy()], rtol=1e-5, atol=1e-7)


def test_pooled_bags_equal_embedding_bag():
    x, y = _data(steps=30)
    _, m1, m2 = _pair("adagrad", combiner="mean", hot_rows=8, warmup_steps=5, flush_every=5)
    np.testing.assert_allclose(_fit(m1, x, y), _fit(m2, x, y), rtol=1e-5)


def test_everything_hot_when_it_fits_and_inference_does_not_insert():
    x, y = _data(steps=20)
    dyn, m1, _ = _pair("adagrad", hot_rows=1000, warmup_steps=2, flush_every=5)
    _fit(m1, x, y)
    s = dyn.stats()
    assert s["hot_used"] == s["size"] == len(np.unique(x))
    assert s["last_step_hits"] == s["last_step_lookups"] > 0
    unseen = np.array([[10**15, -3, 7 * 10**17]], np.int64)
    before = m1.predict(unseen, verbose=0)
    assert dyn.stats()["size"] == s["size"]
    np.testing.assert_allclose(dyn.initial_rows(unseen[0]).numpy(), dyn.initial_rows(unseen[0]).numpy())
    np.testing.assert_array_equal(before, m1.predict(unseen, verbose=0))


def _avazu_strings(n=256):
    with open(DATA) as f:
        rows = list(csv.DictReader(f))[:n]
    cols = ["site_id", "app_id", "device_ip"]
    return np.array([[r[c] for c in cols] for r in rows]), np.array([[float(r["click"])] for r in rows], np.float32)


@pytest.mark.skipif(not DATA.exists(), reason="the Avazu sample is not shipped here")
def test_raw_fingerprint64_ids_grow_the_table():
    strings, y = _avazu_strings()
    ids = tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64), strings.shape).numpy()
    assert np.abs(ids).max() > 2**40  # raw 64-bit hashes, no bucketing
    dyn = htf.layers.DynamicEmbedding(D, hot_rows=32, warmup_steps=2, flush_every=2, name="avazu")
    model = _model(dyn)
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="mse")
    history = model.fit(ids, y, batch_size=32, verbose=0, callbacks=[htf.keras.HybridHashMetrics()])
    assert dyn.stats()["size"] == len(np.unique(ids)) == dyn.stats()["inserts"]
    assert history.history["avazu/size"] == [len(np.unique(ids))]
    assert 0 <= history.history["avazu/hit_ratio"][0] <= 1


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    x, y = _data(steps=40)
    dyn, m1, _ = _pair("adam", hot_rows=8, warmup_steps=4, flush_every=3)
    m1.fit(x[: 20 * BATCH], y[: 20 * BATCH], batch_size=BATCH, verbose=0, shuffle=False)
    m1.save_weights(str(tmp_path / "w"))
    saved = [t.numpy() for t in dyn.table.export()]
    rest = _fit(m1, x[20 * BATCH :], y[20 * BATCH :])

    dyn2, m2, _ = _pair("adam", hot_rows=8, warmup_steps=4, flush_every=3)
    m2.optimizer.build(m2.trainable_variables[1:])
    m2.load_weights(str(tmp_path / "w"))
    for a, b in zip(saved, dyn2.table.export()):
        np.testing.assert_array_equal(a, b.numpy())
    np.testing.assert_array_equal(rest, _fit(m2, x[20 * BATCH :], y[20 * BATCH :]))

    ckpt = tf.train.Checkpoint(table=dyn.table)
    path = ckpt.write(str(tmp_path / "c"))
    other = htf.layers.DynamicEmbedding(D, name="items", hot_rows=3)
    other.build(None)
    tf.train.Checkpoint(table=other.table).read(path).assert_consumed()
    for a, b in zip(dyn.table.export(), other.table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


class _Subclassed(tf.keras.Model):
    """A subclassed model: its layers are built at its first call, after a load_weights may have come."""

    def __init__(self):
        super().__init__()
        self.emb = htf.layers.DynamicEmbedding(D, hot_rows=4, warmup_steps=0, flush_every=1, name="items")
        self.out = tf.keras.layers.Dense(1)

    def call(self, ids, training=None):
        return self.out(tf.reshape(self.emb(ids, training=training), [-1, D]))


@pytest.mark.parametrize("how", ["load_weights", "checkpoint_manager"])
def test_a_restore_before_the_table_is_built_restores_it(tmp_path, how):
    ids, y = np.arange(32, dtype=np.int64)[:, None] * 1000, np.ones((32, 1), np.float32)
    trained = _Subclassed()
    trained.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.5)), loss="mse")
    trained.fit(ids, y, batch_size=8, epochs=2, verbose=0)
    fresh = _Subclassed()  # restored before its first call: the table's entries wait for build()
    if how == "load_weights":
        trained.save_weights(str(tmp_path / "w"))
        fresh.load_weights(str(tmp_path / "w"))
    else:
        tf.train.CheckpointManager(tf.train.Checkpoint(model=trained), str(tmp_path), 1).save()
        tf.train.CheckpointManager(tf.train.Checkpoint(model=fresh), str(tmp_path), 1).restore_or_initialize()
    np.testing.assert_array_equal(fresh.predict(ids, verbose=0), trained.predict(ids, verbose=0))
    assert fresh.emb.stats()["size"] == 32
    for a, b in zip(trained.emb.table.export(), fresh.emb.table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_legacy_h5_of_a_model_with_a_dynamic_table_is_refused(tmp_path):
    """Keras's HDF5 writer saves variables only: the table's ids and rows would be silently lost."""
    x, y = _data(steps=2)
    _, model, _ = _pair("adagrad")
    _fit(model, x, y)
    for save in (lambda: model.save_weights(str(tmp_path / "w.h5")), lambda: model.save(str(tmp_path / "m.h5"))):
        with pytest.raises(NotImplementedError, match=r"DynamicEmbedding 'items'.*\.weights\.h5"):
            save()
    model.save_weights(str(tmp_path / "w.weights.h5"))  # the Keras v3 file holds the table


def test_bad_inputs_name_the_table_and_the_fix(tmp_path):
    dyn = htf.layers.DynamicEmbedding(D, name="users", hot_rows=4)
    with pytest.raises(TypeError, match=r"'users'.*int64.*Fix"):
        dyn(tf.constant([[1.5]]))
    with pytest.raises(TypeError, match=r"'users'.*int64"):
        dyn(tf.constant([["a"]]))
    for kwargs, what in (({"hot_rows": 0}, "hot_rows"), ({"capacity": -1}, "capacity"), ({"hot_rows": -5}, "hot_rows")):
        with pytest.raises(ValueError, match=rf"'bad'.*{what}"):
            htf.layers.DynamicEmbedding(D, name="bad", **kwargs)
    with pytest.raises(ValueError, match="combiner"):
        htf.layers.DynamicEmbedding(D, combiner="max")
    dyn.build(None)
    dyn.table.lookup(tf.constant([1, 2], tf.int64))
    path = tf.train.Checkpoint(table=dyn.table).write(str(tmp_path / "u"))
    wide = htf.layers.DynamicEmbedding(D + 1, name="users", hot_rows=4)
    wide.build(None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'users' has dim 9.*output_dim 8"):
        tf.train.Checkpoint(table=wide.table).read(path)
    renamed = htf.layers.DynamicEmbedding(D, name="items", hot_rows=4)
    renamed.build(None)
    with pytest.raises(ValueError, match=r"'items'.*holds table 'users'"):
        tf.train.Checkpoint(table=renamed.table).read(path)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'users'.*not in the table"):
        dyn.table.apply_sgd(tf.constant([99], tf.int64), tf.ones([1, D]), 0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'users'.*grad \[n, 8\]"):
        dyn.table.apply_sgd(tf.constant([1], tf.int64), tf.ones([1, 3]), 0.1)
    dyn.table.apply_adagrad(tf.constant([1], tf.int64), tf.ones([1, D]), 0.1, 1e-7)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'users' holds 1 optimizer slot"):
        dyn.table.apply_adam(tf.constant([1], tf.int64), tf.ones([1, D]), 0.1, 0.1, 0.01, 1e-7)


NOT_FUSABLE = {
    "momentum": (lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9), "momentum=0.9"),
    "clipnorm": (lambda: tf.keras.optimizers.Adagrad(0.1, clipnorm=1.0), "clipnorm=1.0"),
    "global_clipnorm": (lambda: tf.keras.optimizers.Adam(0.01, global_clipnorm=2.0), "global_clipnorm=2.0"),
    "excluded_weight_decay": (
        lambda: _excluding_decay(tf.keras.optimizers.Adam(0.01, weight_decay=0.01)),
        "weight_decay",
    ),
}


def _excluding_decay(optimizer):
    optimizer.exclude_from_weight_decay(var_names=["items"])
    return optimizer


@pytest.mark.parametrize("kind", list(NOT_FUSABLE))
@pytest.mark.parametrize("packed", [False, True])
def test_a_non_fusable_optimizer_is_refused_naming_the_table_and_the_setting(kind, packed):
    x, y = _data(steps=2)
    model = _model(htf.layers.DynamicEmbedding(D, name="items", hot_rows=4))
    make, setting = NOT_FUSABLE[kind]
    if packed:
        model = htf.keras.optimize(model)
        model.compile(optimizer=make(), loss="mse")
    else:
        model.compile(optimizer=htf.keras.dynamic_optimizer(make()), loss="mse")
    with pytest.raises(ValueError, match=rf"DynamicEmbedding tables \['items'\] cannot train .*{setting}"):
        model.fit(x, y, batch_size=BATCH, verbose=0)


def test_a_packed_stores_refusal_names_the_users_layers_not_the_store():
    x, y = _data(steps=2)
    ids = tf.keras.Input((FIELDS,), dtype=tf.int64)
    parts = [tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(D, name=n)(ids)) for n in ("items", "users")]
    model = htf.keras.optimize(tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()(parts))))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1, clipnorm=1.0), loss="mse")
    with pytest.raises(ValueError, match=r"DynamicEmbedding tables \['items', 'users'\] cannot train .*clipnorm"):
        model.fit(x, y, batch_size=BATCH, verbose=0)


UNHOOKED = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    # slot-less: before the buffer guard it "trained" silently without ever updating the table
    "legacy_sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
    "legacy_adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
}


@pytest.mark.parametrize("kind", list(UNHOOKED))
def test_an_optimizer_not_hooked_for_dynamic_tables_is_a_clear_error(kind):
    x, y = _data(steps=2)
    dyn = htf.layers.DynamicEmbedding(D, name="items", hot_rows=4)
    model = _model(dyn)
    model.compile(optimizer=UNHOOKED[kind](), loss="mse")
    with pytest.raises(
        ValueError,
        match=r"dynamic table 'items' is trained by (optimizer \w+, which is not hooked|the legacy Keras optimizer)"
        r".*hybridtf.keras.dynamic_optimizer\(optimizer\)",
    ):
        model.fit(x, y, batch_size=BATCH, verbose=0)
    if kind.startswith("legacy"):
        with pytest.raises(TypeError, match="cannot hook the legacy Keras optimizer"):
            htf.keras.dynamic_optimizer(UNHOOKED[kind]())
        return
    # the same optimizer hooked trains the table, and a model summary lists the layer
    model.compile(optimizer=htf.keras.dynamic_optimizer(UNHOOKED[kind]()), loss="mse")
    before = dyn(tf.constant([[1, 2, 3]], tf.int64), training=False).numpy()
    model.fit(x, y, batch_size=BATCH, verbose=0)
    assert not np.allclose(dyn(tf.constant([[1, 2, 3]], tf.int64), training=False).numpy(), before)
    model.summary(print_fn=lambda *a, **k: None)


def test_an_unhooked_optimizer_in_a_custom_loop_of_an_optimized_model_is_a_clear_error():
    x, y = _data(steps=1)
    model = htf.keras.optimize(_model(htf.layers.DynamicEmbedding(D, name="items", hot_rows=4)))
    optimizer = tf.keras.optimizers.Adagrad(0.1)

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    with pytest.raises(ValueError, match=r"is trained by optimizer Adagrad, which is not hooked"):
        step(x[:BATCH], y[:BATCH])


def _shared_model(embedding):
    """One table for two features (DIN-style): the first field's id, and a bag of the other two fields' ids."""
    ids = tf.keras.Input((FIELDS,), dtype=tf.int64)
    item = tf.keras.layers.Flatten()(embedding(ids[:, :1]))
    history = tf.keras.layers.GlobalAveragePooling1D()(embedding(ids[:, 1:]))
    h = tf.keras.layers.Concatenate()([item, history])
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h))


@pytest.mark.parametrize("kind, wrap", [("adagrad", False), ("adam", True)])
def test_a_layer_called_twice_in_a_training_step_trains_like_a_shared_embedding(kind, wrap):
    """The second call appends its distinct rows to the step buffer; the update sums them per id (fills.py)."""
    x, y = _data(40)
    dyn = htf.layers.DynamicEmbedding(D, name="shared", hot_rows=16, warmup_steps=10, flush_every=7)
    model = _shared_model(dyn)
    if wrap:  # the only DynamicEmbedding: optimize leaves it unpacked
        model = htf.keras.optimize(model)
    const = tf.keras.initializers.Constant(dyn.initial_rows(np.arange(V)).numpy())
    plain = _shared_model(tf.keras.layers.Embedding(V, D, embeddings_initializer=const, name="plain"))
    model.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer(kind)), loss="mse")
    plain.compile(optimizer=_optimizer(kind), loss="mse")
    np.testing.assert_allclose(_fit(model, x, y), _fit(plain, x, y), rtol=1e-5)
    ids, rows = dyn.table.export()[:2]
    want = plain.get_layer("plain").embeddings.numpy()[ids.numpy()]
    np.testing.assert_allclose(rows.numpy(), want, rtol=1e-5, atol=1e-7)
    assert dyn.stats()["size"] == len(np.unique(x)) and dyn.stats()["step"] == 40


def test_a_layer_with_a_capacity_called_twice_in_a_training_step_is_refused_with_the_fix():
    """Eviction spares the step's used rows: the first call's inserts could evict the second call's rows."""
    model = _shared_model(htf.layers.DynamicEmbedding(D, name="capped", capacity=100, hot_rows=4))
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="mse")
    x, y = _data(1)
    with pytest.raises(ValueError, match=r"'capped' has a capacity \(eviction\).*look all of a step's ids up"):
        model.fit(x, y, batch_size=BATCH, verbose=0)


def test_each_export_after_a_restore_serves_the_restored_rows(tmp_path):
    """Two checkpoints of equal statistics (a restore resets them): each export holds its own rows, not the last."""
    x, y = _data(steps=3)
    for name, lr in (("a", 0.1), ("b", 0.5)):
        _, model, _ = _pair("sgd", hot_rows=8)
        model.optimizer.learning_rate.assign(lr)
        _fit(model, x, y)
        model.save_weights(str(tmp_path / name))
    _, model, _ = _pair("sgd", hot_rows=8)
    for name in ("a", "b"):
        model.load_weights(str(tmp_path / name))
        tf.saved_model.save(model, str(tmp_path / f"export_{name}"))
        served = tf.saved_model.load(str(tmp_path / f"export_{name}")).signatures["serving_default"]
        np.testing.assert_allclose(
            next(iter(served(tf.constant(x[:8])).values())).numpy(), model.predict(x[:8], verbose=0), rtol=1e-6
        )


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_a_full_capacity_table_keeps_training_after_a_restore(tmp_path, policy):
    """Restored rows are eviction candidates of the next step (they were not all "used in this step")."""

    def build():
        dyn = htf.layers.DynamicEmbedding(
            2, capacity=12, hot_rows=2, warmup_steps=1, flush_every=1, evict_policy=policy, name="u"
        )
        ids = tf.keras.Input((1,), dtype=tf.int64)
        model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(dyn(ids))))
        model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
        return dyn, model

    def batch(step):  # 4 new ids per step
        return np.arange(4 * step, 4 * step + 4, dtype=np.int64)[:, None], np.ones((4, 1), np.float32)

    dyn, model = build()
    for step in range(10):
        model.train_on_batch(*batch(step))
    assert dyn.stats()["size"] == 12 and dyn.stats()["evictions"] == 28
    model.save_weights(str(tmp_path / "ck"))
    restored_layer, restored = build()
    restored.load_weights(str(tmp_path / "ck"))
    for step in range(10, 13):
        restored.train_on_batch(*batch(step))
    stats = restored_layer.stats()
    assert stats["size"] == 12 and stats["evictions"] >= 12


def test_a_hot_tier_larger_than_the_table_costs_only_what_the_rows_need():
    """hot_rows=1e9 ("keep everything hot"): the tier grows with the table instead of allocating 1e9 entries."""
    dyn = htf.layers.DynamicEmbedding(16, hot_rows=10**9, warmup_steps=1, flush_every=1, name="user")
    ids = tf.keras.Input((1,), dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(dyn(ids))))
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
    for step in range(4):
        model.train_on_batch(np.arange(8)[:, None] + 8 * step, np.zeros((8, 1), np.float32))
    stats = dyn.stats()
    assert stats["size"] == 32 and stats["hot_used"] == 32 and stats["hot_rows"] == 10**9
    assert stats["hot_bytes"] < 1 << 20


@pytest.mark.parametrize("packed", [False, True])
def test_initial_rows_stay_the_first_sight_rows_after_training(packed):
    dyn, model, _ = _pair("sgd", hot_rows=8)
    before = dyn.initial_rows(np.arange(V)).numpy()
    if packed:
        model = htf.keras.optimize(model)
        model.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("sgd")), loss="mse")
    x, y = _data(steps=3)
    _fit(model, x, y)
    trained = dyn.table.lookup(tf.constant(x[:4, 0]), insert=False).numpy()
    assert not np.allclose(trained, before[x[:4, 0]])  # the rows did train
    np.testing.assert_array_equal(dyn.initial_rows(np.arange(V)).numpy(), before)


def test_one_hot_lookup_of_ragged_ids_is_ragged_and_trains_as_keras_embedding():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 4, 16)
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, V, int(lengths.sum())), lengths)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    dyn = htf.layers.DynamicEmbedding(D, name="seq", hot_rows=8)
    plain = tf.keras.layers.Embedding(
        V, D, embeddings_initializer=tf.keras.initializers.Constant(dyn.initial_rows(np.arange(V)).numpy())
    )
    losses = []
    for layer, optimizer in ((dyn, htf.keras.dynamic_optimizer(tf.keras.optimizers.SGD(0.5))), (plain, "sgd")):
        inputs = tf.keras.Input((None,), dtype=tf.int64, ragged=True)
        out = layer(inputs)
        assert isinstance(out.type_spec, tf.RaggedTensorSpec) and out.shape.as_list() == [None, None, D]
        head = tf.keras.layers.Dense(1, kernel_initializer="ones")
        model = tf.keras.Model(inputs, head(tf.reduce_sum(out, axis=1)))
        model.compile(optimizer=optimizer, loss="mse")
        if layer is plain:
            model.optimizer.learning_rate.assign(0.5)
        losses.append([model.train_on_batch(ids, y) for _ in range(5)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def _shared_layer_model():
    dyn = htf.layers.DynamicEmbedding(2, name="shared", hot_rows=4)
    a, b = tf.keras.Input((1,), dtype=tf.int64), tf.keras.Input((1,), dtype=tf.int64)
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(dyn(a)), tf.keras.layers.Flatten()(dyn(b))])
    return tf.keras.Model([a, b], tf.keras.layers.Dense(1)(h))


def test_an_eager_step_that_looks_a_layer_up_twice_is_named(caplog):
    """Graph mode refuses it (above); eagerly the second fill before the update is logged, not silent."""
    model = _shared_layer_model()
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.SGD(0.5)), loss="mse", run_eagerly=True)
    ids = np.array([[1], [2]], np.int64)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model.train_on_batch([ids, ids + 1], np.ones((2, 1), np.float32))
    assert any("'shared' was looked up again in training mode" in r.getMessage() for r in caplog.records)


def test_a_custom_loop_without_training_true_is_named(caplog):
    dyn = htf.layers.DynamicEmbedding(2, name="user", hot_rows=4)
    ids = tf.keras.Input((1,), dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(dyn(ids))))
    optimizer = htf.keras.dynamic_optimizer(tf.keras.optimizers.SGD(0.5))
    x, y = np.array([[1], [2]], np.int64), np.ones((2, 1), np.float32)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))  # no training=True: a read-only lookup
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    assert dyn.stats()["size"] == 0
    assert any("'user' got no gradient" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_a_keras_file_without_the_dynamic_table_is_refused_by_name(tmp_path, suffix):
    """A file of the model with a static Embedding where a DynamicEmbedding now is: refused, not an empty table."""
    static = _model(tf.keras.layers.Embedding(V, D, name="items"))
    static.compile(optimizer="adagrad", loss="mse")
    path = str(tmp_path / f"m{suffix}")
    static.save(path) if suffix == ".keras" else static.save_weights(path)
    _, model, _ = _pair("adagrad", hot_rows=8)
    with pytest.raises(ValueError, match=r"DynamicEmbedding 'items': the file holds no state for this layer"):
        model.load_weights(path)
    # a file saved before the table was built still loads (nothing learned yet)
    unbuilt = htf.layers.DynamicEmbedding(D, name="lazy")
    unbuilt.save_own_variables(store := {})
    fresh = htf.layers.DynamicEmbedding(D, name="lazy")
    fresh.load_own_variables(store)
    assert fresh.table is None


def test_a_checkpoint_of_another_optimizer_keeps_its_rows_and_starts_fresh_slots(tmp_path):
    """Fine-tuning with a new optimizer: Adagrad's table trains on with Adam as a plain Embedding's
    weights moved into a fresh Adam model do; switching without a restore stays an error."""
    x, y = _data(steps=30)
    half = 15 * BATCH
    dyn, m1, m2 = _pair("adagrad", hot_rows=8, warmup_steps=4, flush_every=3)
    _fit(m1, x[:half], y[:half])
    _fit(m2, x[:half], y[:half])
    path = tf.train.Checkpoint(table=dyn.table).write(str(tmp_path / "table"))

    dyn_adam, n1, n2 = _pair("adam", hot_rows=8, warmup_steps=4, flush_every=3)
    tf.train.Checkpoint(table=dyn_adam.table).read(path).assert_consumed()
    assert dyn_adam.stats()["num_slots"] == 1  # Adagrad's accumulators, until Adam's first update
    for fresh, trained in zip(n1.layers[2:], m1.layers[2:]):
        fresh.set_weights(trained.get_weights())
    n2.set_weights(m2.get_weights())  # the plain model's weights, its Adam fresh
    np.testing.assert_allclose(_fit(n1, x[half:], y[half:]), _fit(n2, x[half:], y[half:]), rtol=1e-5)
    assert dyn_adam.stats()["num_slots"] == 2

    m1.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adam")), loss="mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'items' holds 1 optimizer slot\(s\) per row"):
        _fit(m1, x[:BATCH], y[:BATCH])

"""Packed HybridHash: optimize() puts the DynamicEmbedding tables of a group into one store and one chain.

The backbone: a model with several DynamicEmbedding fields trains the same
per-step losses (fp32, 1e-5 relative, flushes during the run) packed by
``htf.keras.optimize``, unpacked, and as a plain Keras model whose Embedding
rows are each field's deterministic initial rows. Also: ids of different
fields with the same value stay distinct, the grouping rules, a mixed
static + dynamic model, and checkpoints that load packed <-> unpacked bit
for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

V, D, FIELDS, BATCH, STEPS = 48, 8, 4, 32, 100


def _data(steps=STEPS, seed=0, fields=FIELDS, big=False):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1) ** 1.1
    x = rng.choice(V, size=(steps * BATCH, fields), p=p / p.sum()).astype(np.int64)
    if big:  # raw 64-bit values (negative ones too), the same values in every field
        x = np.random.default_rng(99).integers(-(2**63), 2**63 - 1, size=V, dtype=np.int64)[x]
    y = rng.normal(size=(steps * BATCH, 1)).astype(np.float32)
    return x, y


def _dense_head(h):
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    return tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h)


def _dynamic_model(fields=FIELDS, **table):
    ids = tf.keras.Input((fields,), dtype=tf.int64)
    outs = []
    for f in range(fields):
        col = ids[:, f : f + 1]
        combiner = "sum" if f == 1 else None  # one pooled field
        e = htf.layers.DynamicEmbedding(D, combiner=combiner, seed=100 + f, name=f"field{f}", **table)(col)
        outs.append(e if combiner else tf.keras.layers.Flatten()(e))
    return tf.keras.Model(ids, _dense_head(tf.keras.layers.Concatenate()(outs)))


def _plain_model(dynamic_model, ids_seen, fields=FIELDS):
    """Keras Embeddings over the ranks of ``ids_seen``, initialised to each field's initial rows."""
    ids = tf.keras.Input((fields,), dtype=tf.int64)
    outs = []
    for f in range(fields):
        layer = dynamic_model.get_layer(f"field{f}")
        init = tf.keras.initializers.Constant(layer.initial_rows(ids_seen).numpy())
        col = ids[:, f : f + 1]
        if f == 1:
            bag = htf.layers.EmbeddingBag(len(ids_seen), D, combiner="sum", embeddings_initializer=init, name="plain1")
            e = bag(col)
        else:
            emb = tf.keras.layers.Embedding(len(ids_seen), D, embeddings_initializer=init, name=f"plain{f}")
            e = tf.keras.layers.Flatten()(emb(col))
        outs.append(e)
    return tf.keras.Model(ids, _dense_head(tf.keras.layers.Concatenate()(outs)))


def _optimizer(kind):
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)  # a new rate every step
    return {
        "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
        "adam": lambda: tf.keras.optimizers.Adam(0.01),
        "adagrad_schedule": lambda: tf.keras.optimizers.Adagrad(schedule),
    }[kind]()


class _Losses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])


def _fit(model, x, y):
    losses = _Losses()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[losses])
    return np.array(losses.losses)


TABLE = dict(hot_rows=12, warmup_steps=10, flush_every=7)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "adagrad_schedule"])
def test_packed_equals_unpacked_and_plain_keras(kind):
    x, y = _data(big=True)
    packed = htf.keras.optimize(_dynamic_model(**TABLE))
    assert [sorted(g.members) for g in packed.hybridtf_dynamic_plan] == [[f"field{f}" for f in range(FIELDS)]]
    unpacked = _dynamic_model(**TABLE)
    seen, ranks = np.unique(x, return_inverse=True)
    plain = _plain_model(unpacked, seen)
    for m in (packed, unpacked):
        m.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer(kind)), loss="mse")
    plain.compile(optimizer=_optimizer(kind), loss="mse")
    l_packed, l_unpacked = _fit(packed, x, y), _fit(unpacked, x, y)
    l_plain = _fit(plain, ranks.reshape(x.shape), y)
    assert len(l_packed) == STEPS
    np.testing.assert_allclose(l_packed, l_unpacked, rtol=1e-5)
    np.testing.assert_allclose(l_packed, l_plain, rtol=1e-5)
    # one store: its size is the distinct (field, id) pairs; flushes happened; per field the rows are the plain ones
    stats = packed.get_layer("field0").stats()
    assert stats["size"] == sum(len(np.unique(x[:, f])) for f in range(FIELDS))
    assert stats["flushes"] >= (STEPS - 10) // 7 and stats["hot_used"] == 12 * FIELDS and stats["step"] == STEPS
    for f in range(FIELDS):
        ids, rows = packed.get_layer(f"field{f}").table.export()[:2]
        plain_rows = plain.get_layer(f"plain{f}").embeddings.numpy()
        np.testing.assert_allclose(rows.numpy(), plain_rows[np.searchsorted(seen, ids.numpy())], rtol=1e-5, atol=1e-7)


def _train_graph_ops(model, x, y):
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    graph = model.train_function.get_concrete_function(iter(tf.data.Dataset.from_tensors((x[:BATCH], y[:BATCH])))).graph
    ops = [op.type for op in graph.get_operations()]
    for f in graph._functions.values():  # the step's body is a nested function
        ops += [n.op for n in f.definition.node_def]
    return ops


def test_one_store_one_chain_one_update_per_step():
    x, y = _data(steps=2)
    packed = htf.keras.optimize(_dynamic_model(**TABLE))
    packed.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adagrad")), loss="mse")
    unpacked = _dynamic_model(**TABLE)
    unpacked.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adagrad")), loss="mse")
    ops_packed, ops_unpacked = _train_graph_ops(packed, x, y), _train_graph_ops(unpacked, x, y)
    # the lookup hands the update each distinct row's record (no second hash-map probe)
    assert ops_packed.count("HybridTF>HybridHashLookupRecords") == 1
    assert ops_packed.count("HybridTF>HybridHashApplyAdagradRecords") == 1
    assert "HybridTF>HybridHashLookup" not in ops_packed
    assert "HybridTF>HybridHashApplyAdagrad" not in ops_packed
    # the static chain's fused pieces: one (member, id) unique over the fields' tensors (no concat
    # of the ids), the Concatenate + first Dense as one StitchConcatMatMul over the store's distinct
    # rows; no per-field split, no TF uniques
    assert ops_packed.count("HybridTF>HybridHashUniqueFields") == 1
    assert ops_packed.count("HybridTF>StitchConcatMatMul") == 1
    assert ops_packed.count("HybridTF>StitchConcatMatMulGrad") == 1
    assert packed.hybridtf_fused_concats and packed.hybridtf_fused_dense  # the model says so too
    for op in ("Unique", "UniqueWithCounts", "SplitV", "UnsortedSegmentSum"):
        assert op not in ops_packed, op
    assert ops_unpacked.count("HybridTF>HybridHashLookup") == FIELDS
    assert ops_unpacked.count("HybridTF>HybridHashApplyAdagrad") == FIELDS
    assert packed.get_layer("field2").stats()["step"] == unpacked.get_layer("field2").stats()["step"] == 1


def test_grouping_rules_and_skipped_reasons():
    ids = tf.keras.Input((6,), dtype=tf.int64)
    specs = [
        dict(output_dim=4, hot_rows=8, name="a"),
        dict(output_dim=4, hot_rows=8, name="b"),
        dict(output_dim=8, hot_rows=8, name="c"),  # other dim
        dict(output_dim=8, hot_rows=8, name="d"),
        dict(output_dim=4, hot_rows=16, name="e"),  # other hot size, alone
        dict(output_dim=4, hot_rows=8, capacity=100, name="f"),  # eviction per table
    ]
    outs = [tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(**s)(ids[:, i : i + 1])) for i, s in enumerate(specs)]
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()(outs)))
    model = htf.keras.optimize(model)
    groups = {tuple(sorted(p.members)): p for p in model.hybridtf_dynamic_plan}
    assert set(groups) == {("a", "b"), ("c", "d")}
    assert groups[("a", "b")].dim == 4 and groups[("c", "d")].dim == 8
    skipped = {s.name: s.reason for s in model.hybridtf_skipped}
    assert "capacity=100" in skipped["f"] and "nothing to pack" in skipped["e"]
    assert model.get_layer("a").table.store is model.get_layer("b").table.store
    assert model.get_layer("a").table.store is not model.get_layer("c").table.store
    x = np.arange(60, dtype=np.int64).reshape(10, 6)
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="mse")
    model.fit(x, np.ones((10, 1), np.float32), batch_size=5, verbose=0)
    assert model.get_layer("a").stats()["size"] == 20 and model.get_layer("f").stats()["size"] == 10


def _mixed_model():
    ids = tf.keras.Input((3,), dtype=tf.int64)
    static = tf.keras.layers.Embedding(V, D, embeddings_initializer=tf.keras.initializers.RandomUniform(seed=5))
    outs = [tf.keras.layers.Flatten()(static(ids[:, :1]))]
    for f in (1, 2):
        layer = htf.layers.DynamicEmbedding(D, seed=f, name=f"dyn{f}", **TABLE)
        outs.append(tf.keras.layers.Flatten()(layer(ids[:, f : f + 1])))
    return tf.keras.Model(ids, _dense_head(tf.keras.layers.Concatenate()(outs)))


def test_mixed_static_and_dynamic_model_is_exact():
    x, y = _data(steps=40, fields=3)
    packed, unpacked = htf.keras.optimize(_mixed_model()), _mixed_model()
    assert packed.hybridtf_plan.packed_tables and len(packed.hybridtf_dynamic_plan) == 1
    for m in (packed, unpacked):
        m.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adagrad")), loss="mse")
    np.testing.assert_allclose(_fit(packed, x, y), _fit(unpacked, x, y), rtol=1e-5)


def _exports(model, names):
    return {n: [t.numpy() for t in model.get_layer(n).table.export()] for n in names}


def _compiled(model, kind="adam"):
    model.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer(kind)), loss="mse")
    model.optimizer.build(model.trainable_variables)  # its state is restored now, not deferred
    return model


def test_checkpoints_load_packed_to_unpacked_and_back_bit_identical(tmp_path):
    x, y = _data(steps=30, big=True)
    names = [f"field{f}" for f in range(FIELDS)]
    packed = _compiled(htf.keras.optimize(_dynamic_model(**TABLE)))
    _fit(packed, x[: 20 * BATCH], y[: 20 * BATCH])
    packed.save_weights(str(tmp_path / "packed"))
    saved = _exports(packed, names)
    # packed -> unpacked: every table holds the packed member's ids, rows, slots and counts, bit for bit
    unpacked = _compiled(_dynamic_model(**TABLE))
    unpacked.load_weights(str(tmp_path / "packed"))
    for n in names:
        for a, b in zip(saved[n], _exports(unpacked, names)[n]):
            np.testing.assert_array_equal(a, b)
    # unpacked -> packed (a fresh packed model)
    unpacked.save_weights(str(tmp_path / "unpacked"))
    again = _compiled(htf.keras.optimize(_dynamic_model(**TABLE)))
    again.load_weights(str(tmp_path / "unpacked"))
    for n in names:
        for a, b in zip(saved[n], _exports(again, names)[n]):
            np.testing.assert_array_equal(a, b)
    # optimizer state (Adam's iterations and the dense layers' moments) comes back too: later training agrees
    rest_x, rest_y = x[20 * BATCH :], y[20 * BATCH :]
    l_packed = _fit(packed, rest_x, rest_y)  # the model that never stopped
    np.testing.assert_allclose(_fit(again, rest_x, rest_y), l_packed, rtol=1e-5)
    np.testing.assert_allclose(_fit(unpacked, rest_x, rest_y), l_packed, rtol=1e-5)


def test_keras_file_holds_the_tables_and_resumes_exactly(tmp_path):
    """``model.save("m.keras")`` keeps every table (ids, rows, slots, counts) and a hooked optimizer."""
    x, y = _data(steps=30, big=True)
    names = [f"field{f}" for f in range(FIELDS)]
    packed = htf.keras.optimize(_dynamic_model(**TABLE))
    packed.compile(optimizer=_optimizer("adam"), loss="mse")  # no dynamic_optimizer: compile hooks it
    _fit(packed, x[: 20 * BATCH], y[: 20 * BATCH])
    packed.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))  # a plain model: one store per layer
    saved = _exports(packed, names)
    for n in names:
        for a, b in zip(saved[n], _exports(loaded, names)[n]):
            np.testing.assert_array_equal(a, b)
    rest_x, rest_y = x[20 * BATCH :], y[20 * BATCH :]
    l_packed = _fit(packed, rest_x, rest_y)
    np.testing.assert_allclose(_fit(loaded, rest_x, rest_y), l_packed, rtol=1e-5)


def test_optimize_keeps_a_trained_layers_rows_and_bad_members_are_errors():
    x, y = _data(steps=5)
    model = _dynamic_model(**TABLE)
    model.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adagrad")), loss="mse")
    _fit(model, x, y)
    names = [f"field{f}" for f in range(FIELDS)]
    before = _exports(model, names)
    model = htf.keras.optimize(model)
    after = _exports(model, names)
    for n in names:
        for a, b in zip(before[n], after[n]):
            np.testing.assert_array_equal(a, b)
    store = model.get_layer("field0").table.store
    with pytest.raises(tf.errors.InvalidArgumentError, match="members\\[1\\] = 7 is not a table of this store"):
        store.lookup(tf.constant([1, 2], tf.int64), insert=False, members=tf.constant([0, 7], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="members must be empty or one per id"):
        store.lookup(tf.constant([1, 2], tf.int64), insert=False, members=tf.constant([0], tf.int64))
    with pytest.raises(ValueError, match="packed into store"):
        model.get_layer("field0").table.lookup(tf.constant([1], tf.int64), insert=True)


def test_saved_model_of_a_packed_model_serves_the_learned_rows(tmp_path):
    x, y = _data(steps=8)
    model = _compiled(htf.keras.optimize(_dynamic_model(**TABLE)), "adagrad")
    _fit(model, x, y)
    expected = model.predict(x[:64], verbose=0)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    out = next(iter(loaded.signatures["serving_default"](tf.constant(x[:64])).values()))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    # calling the loaded object: Keras saved each traced call of the layers, the record pass's too, which
    # served zero rows
    for training in (False, True):
        np.testing.assert_allclose(loaded(tf.constant(x[:64]), training=training), expected, rtol=1e-5, atol=1e-6)
    # Keras's ExportArchive, twice: the second export holds the rows trained after the first
    for export in ("e1", "e2"):
        model.export(str(tmp_path / export))
        served = tf.saved_model.load(str(tmp_path / export)).signatures["serving_default"]
        exported = next(iter(served(tf.constant(x[:64])).values())).numpy()
        np.testing.assert_allclose(exported, model.predict(x[:64], verbose=0), rtol=1e-5, atol=1e-6)
        assert b"HybridTF" not in (tmp_path / export / "saved_model.pb").read_bytes()
        _fit(model, x[: 2 * BATCH], y[: 2 * BATCH])
    assert not np.allclose(exported, model.predict(x[:64], verbose=0))


@pytest.mark.parametrize("tables", ["dynamic", "static_and_dynamic"])
@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_a_keras_weights_file_of_a_model_with_packed_dynamic_tables_resumes_exactly(tmp_path, tables, kind):
    """Keras files keep the optimizer's state by position: loading one builds the optimizer first (the dynamic
    tables' buffers have no slots there: counting them took the file for a partial one and skipped its state)."""
    x, y = _data(steps=6, fields=FIELDS if tables == "dynamic" else 3)
    half = 3 * BATCH

    def build():
        plain = _dynamic_model(**TABLE) if tables == "dynamic" else _mixed_model()
        model = htf.keras.optimize(plain)
        model.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer(kind)), loss="mse")  # built lazily
        return model

    model = build()
    assert htf.keras.is_optimized(model) and bool(model.hybridtf_plan.packed_tables) == (tables != "dynamic")
    _fit(model, x[:half], y[:half])
    model.save_weights(str(tmp_path / "w.weights.h5"))
    resumed = build()
    resumed.load_weights(str(tmp_path / "w.weights.h5"))
    assert int(resumed.optimizer.iterations) == int(model.optimizer.iterations) == 3
    np.testing.assert_allclose(_fit(resumed, x[half:], y[half:]), _fit(model, x[half:], y[half:]), rtol=1e-6)


def test_a_restore_of_another_dim_names_the_member_table(tmp_path):
    def build(dim, pack):
        a, b = tf.keras.Input((1,), dtype=tf.int64), tf.keras.Input((1,), dtype=tf.int64)
        user = tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(dim, name="user")(a))
        item = tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(8, name="item")(b))
        model = tf.keras.Model([a, b], tf.keras.layers.Concatenate()([user, item]))
        return htf.keras.optimize(model) if pack else model

    model = build(4, False)
    model([np.array([[1]]), np.array([[2]])], training=True)
    tf.train.Checkpoint(model=model).write(str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=r"table 'user' has dim 8 .* output_dim=4"):
        tf.train.Checkpoint(model=build(8, True)).read(str(tmp_path / "ck"))


@pytest.mark.parametrize("pack", [False, True], ids=["unpacked", "packed"])
def test_a_restore_into_layers_in_another_order_names_the_order(tmp_path, pack):
    """A probe: a checkpoint of layers [a, b] read into a model built [b, a] told the user to rename layer 'b' to
    'a' (which a layer already has); TensorFlow matched the layers by position: the error says so."""

    def build(names):
        ids = tf.keras.Input((1,), dtype=tf.int64)
        parts = [tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(4, name=n)(ids)) for n in names]
        model = tf.keras.Model(ids, tf.keras.layers.Add()(parts))
        return htf.keras.optimize(model) if pack else model

    model = build(["a", "b"])
    model(np.array([[1], [2]]), training=True)
    model.save_weights(str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=r"table 'b': the checkpoint entry holds table 'a'.* by their position.*order"):
        build(["b", "a"]).load_weights(str(tmp_path / "ck"))


def test_a_refused_member_restore_leaves_the_table_as_it_was(tmp_path):
    """An Adam checkpoint into an Adagrad-trained store: the restore is refused naming the layer, and the member's
    trained rows are still there (they used to be removed before the check; the capacity check, reachable through
    the store's own API, is tested in tests/ops/test_hybrid_hash_records.py)."""
    x, y = _data(steps=4)
    saved, model = (htf.keras.optimize(_dynamic_model(**TABLE)) for _ in range(2))
    saved.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse")
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
    _fit(saved, x, y)
    saved.save_weights(str(tmp_path / "ck"))
    _fit(model, *_data(steps=4, seed=1))
    before = [t.numpy() for t in model.get_layer("field0").table.export()[:4]]
    predictions = model.predict(x[:64], verbose=0)
    expected = r"DynamicEmbedding 'field0' \(member 0 of the packed store .*\) was not restored.*2 optimizer slot"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        model.load_weights(str(tmp_path / "ck"))
    after = [t.numpy() for t in model.get_layer("field0").table.export()[:4]]
    assert len(before[0]) > 0
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.predict(x[:64], verbose=0), predictions)


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_a_packed_layer_called_for_two_features_trains_like_a_shared_embedding(kind):
    """Unpacked, a layer's training lookup is one call per step (refused otherwise); packed, each call is a field
    of the group's one lookup, and the gradients of both calls reach the shared rows as a shared Embedding's do."""
    x, y = _data(steps=20, fields=3)

    def build(shared, other):
        ids = tf.keras.Input((3,), dtype=tf.int64)
        outs = [tf.keras.layers.Flatten()(layer(ids[:, f : f + 1])) for f, layer in enumerate((shared, shared, other))]
        return tf.keras.Model(ids, _dense_head(tf.keras.layers.Concatenate()(outs)))

    shared = htf.layers.DynamicEmbedding(D, seed=7, name="shared", hot_rows=8, warmup_steps=2, flush_every=3)
    other = htf.layers.DynamicEmbedding(D, seed=8, name="other", hot_rows=8, warmup_steps=2, flush_every=3)
    model = htf.keras.optimize(build(shared, other))
    model.compile(optimizer=_optimizer(kind), loss="mse")
    rows = [tf.keras.initializers.Constant(t.initial_rows(np.arange(V)).numpy()) for t in (shared, other)]
    plain = build(*(tf.keras.layers.Embedding(V, D, embeddings_initializer=r) for r in rows))
    plain.compile(optimizer=_optimizer(kind), loss="mse")
    np.testing.assert_allclose(_fit(model, x, y), _fit(plain, x, y), rtol=1e-5)


@pytest.mark.parametrize("tables", ["dynamic", "static_and_dynamic"])
def test_an_optimized_model_with_packed_dynamic_tables_trains_in_a_hybridtf_function_loop(tables, caplog):
    """htf.function's record pass (a scratch graph that never runs) gives the group's buffer no gradient: that is
    not a table left untrained (it warned, and crashed naming the group). The real pass trains as tf.function."""
    fields = FIELDS if tables == "dynamic" else 3
    x, y = _data(steps=8, fields=fields)

    def run(optimized: bool, decorate):
        plain = _dynamic_model(**TABLE) if tables == "dynamic" else _mixed_model()
        model = htf.keras.optimize(plain) if optimized else plain
        optimizer = htf.keras.dynamic_optimizer(_optimizer("adagrad"))

        @decorate
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return np.array([float(step(x[i : i + BATCH], y[i : i + BATCH])) for i in range(0, len(x), BATCH)])

    with caplog.at_level("WARNING", logger="hybridtf"):
        packed = run(True, htf.function)
    assert "got no gradient" not in caplog.text
    np.testing.assert_allclose(packed, run(True, tf.function), rtol=1e-6)
    np.testing.assert_allclose(packed, run(False, tf.function), rtol=1e-5)


def test_dynamic_plan_is_an_empty_list_when_no_store_is_packed():
    """Like hybridtf_plan / hybridtf_skipped, the attribute exists on every optimized model."""
    ids = tf.keras.Input((1,), dtype=tf.int64)

    def build(embedding):
        return tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(embedding(ids))))

    for model in (build(tf.keras.layers.Embedding(9, 2)), build(htf.layers.DynamicEmbedding(2))):
        optimized = htf.keras.optimize(model)
        assert optimized.hybridtf_dynamic_plan == []
        if optimized.hybridtf_plan.packed_tables:  # the static table: interleaving is set up (one group)
            assert optimized.hybridtf_interleaving.num_groups == 1
        else:
            assert optimized.hybridtf_interleaving is None


def test_a_packed_store_looked_up_by_two_model_calls_in_a_step_is_refused_with_the_fix():
    """A custom step calling the optimized model twice: the packed store's buffer serves one call (else refused)."""
    model = htf.keras.optimize(_dynamic_model())
    opt = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1))
    x, y = _data(steps=1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y) + tf.square(model(x + 1, training=True)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    with pytest.raises(ValueError, match=r"looked up by two calls of the model in one training step.*exclude="):
        step(tf.constant(x), tf.constant(y))


def test_a_packed_member_under_stop_gradient_keeps_its_rows_as_plain_keras_does():
    """One field of a packed store never gets a gradient: under Adam (whose update moves every stored row) its rows
    stay as they were, as a plain Keras Embedding without gradient does."""

    def build(plain_of=None, seen=None):
        ids = tf.keras.Input((FIELDS,), dtype=tf.int64)
        outs = []
        for f in range(FIELDS):
            if plain_of is None:
                layer = htf.layers.DynamicEmbedding(D, seed=100 + f, name=f"field{f}", **TABLE)
            else:
                init = tf.keras.initializers.Constant(plain_of.get_layer(f"field{f}").initial_rows(seen).numpy())
                layer = tf.keras.layers.Embedding(len(seen), D, embeddings_initializer=init)
            e = tf.keras.layers.Flatten()(layer(ids[:, f : f + 1]))
            outs.append(tf.keras.layers.Lambda(tf.stop_gradient)(e) if f == 2 else e)
        return tf.keras.Model(ids, _dense_head(tf.keras.layers.Concatenate()(outs)))

    x, y = _data(big=True)
    seen, ranks = np.unique(x, return_inverse=True)
    packed = htf.keras.optimize(build())
    assert [sorted(g.members) for g in packed.hybridtf_dynamic_plan] == [[f"field{f}" for f in range(FIELDS)]]
    plain = build(build(), seen)
    packed.compile(optimizer=htf.keras.dynamic_optimizer(_optimizer("adam")), loss="mse")
    plain.compile(optimizer=_optimizer("adam"), loss="mse")
    np.testing.assert_allclose(_fit(packed, x, y), _fit(plain, ranks.reshape(x.shape), y), rtol=1e-5)
    layer = packed.get_layer("field2")
    ids, rows = layer.table.export()[:2]
    np.testing.assert_array_equal(rows.numpy(), layer.initial_rows(ids).numpy())


def test_a_packed_member_frozen_after_optimize_is_refused_at_compile():
    """Its rows share the group's store: it kept training silently (the store's buffer stayed trainable)."""
    model = htf.keras.optimize(_dynamic_model(**TABLE))
    assert model.hybridtf_dynamic_plan
    model.get_layer("field2").trainable = False
    with pytest.raises(ValueError, match=r"\['field2'\] were packed while trainable and frozen afterwards"):
        _compiled(model)


@pytest.mark.parametrize("capacity", [None, 40])
def test_a_frozen_dynamic_embedding_looks_up_as_in_inference_also_in_training_mode(capacity):
    """No insert, eviction or statistics: with a capacity, unseen ids evicted every trained row, then the
    table was 'full'; without one, it grew with every unseen id."""
    table = dict(capacity=capacity, hot_rows=2, warmup_steps=1000) if capacity else {}
    layer = htf.layers.DynamicEmbedding(D, seed=5, name="user", **table)
    ids = tf.keras.Input((3,), dtype=tf.int64)
    model = tf.keras.Model(ids, _dense_head(tf.keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="mse")
    rng = np.random.default_rng(0)
    seen = rng.integers(0, 10, size=(64, 3))
    model.fit(seen, rng.normal(size=(64, 1)), batch_size=8, epochs=2, verbose=0)
    before, stats = [t.numpy() for t in layer.table.export()], layer.table.stats()
    layer.trainable = False
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)), loss="mse")
    unseen = rng.integers(1000, 10**9, size=(128, 3))
    model.fit(unseen, rng.normal(size=(128, 1)), batch_size=8, epochs=1, verbose=0)
    after = [t.numpy() for t in layer.table.export()]
    assert len(after[0]) == len(before[0]) == 10
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
    assert layer.table.stats() == stats

"""hybridtf.keras.optimize: what it packs, what it skips and why, errors, memory, decorator use."""

from __future__ import annotations

import gc
import logging
import re
import weakref

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.capture.keras_capture import is_captured


def _model(extra_layers=()):
    ids = {name: tf.keras.Input(shape=(), dtype=tf.int64, name=name) for name in ("a", "b", "c", "d")}
    layers = {
        "a": tf.keras.layers.Embedding(50, 4, name="emb_a"),
        "b": tf.keras.layers.Embedding(60, 4, name="emb_b"),
        "c": tf.keras.layers.Embedding(70, 8, name="emb_c"),
        "d": tf.keras.layers.Embedding(80, 4, name="emb_d", embeddings_regularizer=lambda w: 0.01 * tf.reduce_sum(w)),
    }
    embs = [tf.keras.layers.Flatten()(layers[k](ids[k])) for k in ids]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(embs))
    return tf.keras.Model(ids, out)


def _batch(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return {k: tf.constant(rng.integers(0, 50, size=n)) for k in "abcd"}


def test_unsupported_layers_are_skipped_with_reasons_and_the_rest_packed():
    model = htf.keras.optimize(_model())
    skipped = {s.name: s.reason for s in model.hybridtf_skipped}
    assert list(skipped) == ["emb_d"] and "has no gradient formula hybridtf can fold" in skipped["emb_d"]
    plan = model.hybridtf_plan
    packed = {m.name for pt in plan.packed_tables for m in pt.members}
    assert packed == {"emb_a", "emb_b", "emb_c"}
    assert {pt.dim for pt in plan.packed_tables} == {4, 8}  # D-packing by dim
    assert not is_captured(model.get_layer("emb_d"))
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(_batch(), tf.ones([16, 1]), verbose=0)  # the skipped layer still trains as plain Keras


def test_out_of_vocabulary_id_names_the_table_in_packed_and_direct_paths():
    model = htf.keras.optimize(_model())
    bad = _batch()
    bad["b"] = tf.constant([3] * 15 + [600], tf.int64)
    message = r"embedding table 'emb_b' got id 600 \(flat position 15 of its ids\), outside its vocabulary \[0, 60\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.predict_on_batch(bad)  # packed path (tf.function)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.get_layer("emb_b")(bad["b"])  # the layer on its own: the direct path


def test_invalid_plan_overrides_name_the_table_or_group():
    with pytest.raises(ValueError, match="emb_zz"):
        htf.keras.optimize(_model(), exclude=["emb_zz"])
    with pytest.raises(ValueError, match=r"mix"):
        htf.keras.optimize(_model(), force_groups={"g": ["emb_a", "emb_c"]})  # dims 4 and 8


def test_excluded_tables_stay_plain_and_exactness_holds():
    plain, wrapped = _model(), _model()
    wrapped.set_weights(plain.get_weights())
    wrapped = htf.keras.optimize(wrapped, exclude=["emb_a"])
    assert "emb_a" in {s.name for s in wrapped.hybridtf_skipped}
    assert not is_captured(wrapped.get_layer("emb_a"))
    for m in (plain, wrapped):
        m.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    for step in range(5):
        x, y = _batch(seed=step), tf.constant(np.random.default_rng(step).integers(0, 2, (16, 1)), tf.float32)
        np.testing.assert_allclose(wrapped.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-5)


def test_original_table_variables_are_released():
    model = _model()
    refs = [weakref.ref(model.get_layer(n).embeddings) for n in ("emb_a", "emb_b", "emb_c")]
    model = htf.keras.optimize(model)
    gc.collect()
    assert all(r() is None for r in refs), "optimize() must not keep the per-table variables alive"


def test_decorator_and_idempotence():
    @htf.keras.optimize
    def build():
        return _model()

    model = build()
    assert htf.keras.is_optimized(model)
    assert htf.keras.optimize(model) is model


def test_wrapping_a_trained_model_changes_no_prediction():
    model = _model()
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(_batch(), tf.ones([16, 1]), verbose=0, epochs=3)
    x = _batch(seed=5)
    before = model.predict_on_batch(x)
    model = htf.keras.optimize(model)
    np.testing.assert_allclose(model.predict_on_batch(x), before, rtol=1e-6, atol=1e-7)


class _Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.emb = tf.keras.layers.Embedding(10, 2)
        self.out = tf.keras.layers.Dense(1)

    def call(self, ids):
        return self.out(self.emb(ids))


def test_unbuilt_model_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a built model"):
        htf.keras.optimize(_Subclassed())
    model = _Subclassed()
    model(tf.constant([1, 2]))
    assert htf.keras.is_optimized(htf.keras.optimize(model))


class _TiedLookup(tf.keras.Model):
    """Reads one table's variable directly (a sparse lookup on ``layer.embeddings``), another through its layer."""

    def __init__(self, training_only=False):
        super().__init__()
        self.emb_a = tf.keras.layers.Embedding(50, 4, name="emb_a")
        self.emb_b = tf.keras.layers.Embedding(60, 4, name="emb_b")
        self.emb_b.build((None,))  # its variable is read without calling the layer
        self.out = tf.keras.layers.Dense(1, activation="sigmoid")
        self.training_only = training_only

    def call(self, x, training=None):
        a = self.emb_a(x["a"])
        if self.training_only and not training:
            return self.out(tf.concat([a, self.emb_b(x["b"])], axis=1))
        bag = tf.sparse.from_dense(tf.stack([x["b"], x["b"] // 2], axis=1))
        b = tf.nn.safe_embedding_lookup_sparse(self.emb_b.embeddings, bag, combiner="mean")
        return self.out(tf.concat([a, b], axis=1))


def _train_like_plain(plain, optimized, y):
    for m in (plain, optimized):
        m.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    for step in range(4):
        x = _batch(seed=step)
        np.testing.assert_allclose(optimized.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-5)


def test_a_table_read_directly_in_a_call_stays_unpacked_with_the_reason_and_trains_exactly():
    """optimize() traces the calls of layers holding embedding layers (inference mode, a scratch graph): a table
    read as a tensor there stays unpacked, named with the reader, instead of failing at the first step."""
    x, y = _batch(), tf.ones([16, 1])
    plain, optimized = _TiedLookup(), _TiedLookup()
    plain(x), optimized(x)
    optimized.set_weights(plain.get_weights())
    optimized = htf.keras.optimize(optimized)
    [skipped] = optimized.hybridtf_skipped
    assert skipped.name == "emb_b" and re.search(r"the call of '.*' reads its table variable", skipped.reason)
    assert {m.name for pt in optimized.hybridtf_plan.packed_tables for m in pt.members} == {"emb_a"}
    _train_like_plain(plain, optimized, y)


def test_direct_read_of_a_packed_table_names_the_table_and_exclude_fixes_it():
    """A direct read optimize() cannot see (here in training mode only) fails at the first step, naming the fix."""
    x, y = _batch(), tf.ones([16, 1])
    model = _TiedLookup(training_only=True)
    model(x)
    model = htf.keras.optimize(model)
    assert not model.hybridtf_skipped
    rows = model.emb_b.embeddings
    np.testing.assert_array_equal(tf.convert_to_tensor(rows).numpy(), rows.numpy())  # eager read: the table's rows
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    with pytest.raises(Exception, match=r"table 'emb_b' is read directly.*optimize\(model, exclude=\['emb_b'\]\)"):
        model.train_on_batch(x, y)
    plain, fixed = _TiedLookup(training_only=True), _TiedLookup(training_only=True)
    plain(x), fixed(x)
    fixed.set_weights(plain.get_weights())
    fixed = htf.keras.optimize(fixed, exclude=["emb_b"])
    assert {m.name for pt in fixed.hybridtf_plan.packed_tables for m in pt.members} == {"emb_a"}
    _train_like_plain(plain, fixed, y)


def test_model_without_embedding_layers_warns_that_nothing_is_packed(caplog):
    class RawTable(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = self.add_weight("table", (30, 4), initializer="uniform")
            self.out = tf.keras.layers.Dense(1)

        def call(self, ids):
            return self.out(tf.nn.embedding_lookup(self.table, ids))

    model = RawTable()
    model(tf.constant([1, 2]))
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model = htf.keras.optimize(model)
    assert model.hybridtf_plan.packed_tables == () and model.hybridtf_skipped == []
    [record] = [r for r in caplog.records if r.name == "hybridtf" and r.levelno == logging.WARNING]
    assert "found no embedding layer" in record.getMessage() and "tf.keras.layers.Embedding" in record.getMessage()


def test_jit_compile_falls_back_to_the_plain_step_with_a_warning(caplog):
    model = htf.keras.optimize(_model())
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model.compile(optimizer="adagrad", loss="binary_crossentropy", jit_compile=True)
    assert not model.jit_compile
    assert any("cannot be compiled by XLA" in r.getMessage() for r in caplog.records if r.name == "hybridtf")
    model.fit(_batch(), tf.ones([16, 1]), verbose=0)  # would fail in XLA: no XLA kernel for the packed ops


def test_mirroring_strategies_are_refused_with_the_fix_and_one_device_strategy_trains():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = _model()
        with pytest.raises(ValueError, match=r"under MirroredStrategy.*horovodrun"):
            htf.keras.optimize(mirrored)
    with pytest.raises(ValueError, match="distributed variables"):  # built under the scope, optimized outside
        htf.keras.optimize(mirrored)
    model = htf.keras.optimize(_model())
    with strategy.scope(), pytest.raises(ValueError, match="compiled under MirroredStrategy"):
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = htf.keras.optimize(_model())
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        model.fit(_batch(), tf.ones([16, 1]), verbose=0)
    assert model.hybridtf_plan.packed_tables


@pytest.mark.parametrize("what", ["Tables", "EmbeddingBag", "DynamicEmbedding"])
def test_hybridtf_tables_and_layers_made_under_a_mirroring_strategy_are_refused_with_the_fix(what):
    """Not only optimize: a Tables set or a hybridtf layer built in strategy.scope() names the strategy and the fix
    (they failed later in TensorFlow's DistributedVariable.handle, naming neither)."""
    make = {
        "Tables": lambda: htf.embedding.Tables([htf.embedding.TableConfig("t", 10, 4)]),
        "EmbeddingBag": lambda: htf.layers.EmbeddingBag(10, 4)(tf.keras.Input((3,), dtype=tf.int64)),
        "DynamicEmbedding": lambda: htf.layers.DynamicEmbedding(4)(tf.keras.Input((3,), dtype=tf.int64)),
    }[what]
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.raises(
            ValueError, match=rf"{what}.* under MirroredStrategy.*outside strategy.scope\(\).*horovodrun"
        ):
            make()
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        make()


def test_dense_features_embedding_columns_are_named_as_skipped(caplog):
    columns = [
        tf.feature_column.embedding_column(tf.feature_column.categorical_column_with_identity("a", 50), 4),
        tf.feature_column.numeric_column("x"),
    ]
    inputs = {"a": tf.keras.Input((), dtype=tf.int64, name="a"), "x": tf.keras.Input((), name="x")}
    h = tf.keras.layers.DenseFeatures(columns, name="columns")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(h))
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model = htf.keras.optimize(model)
    assert [s.name for s in model.hybridtf_skipped] == ["columns"]
    assert "a_embedding" in model.hybridtf_skipped[0].reason
    assert any("DenseFeatures" in r.getMessage() for r in caplog.records if r.name == "hybridtf")


def _serializable_model():
    ids = {name: tf.keras.Input(shape=(), dtype=tf.int64, name=name) for name in "abc"}
    embs = [tf.keras.layers.Embedding(50 + 10 * i, 4, name=f"emb_{k}")(ids[k]) for i, k in enumerate(ids)]
    return tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()(embs)))


def test_layer_weights_clone_and_freezing_of_an_optimized_model():
    model = htf.keras.optimize(_serializable_model())
    layer = model.get_layer("emb_b")
    [rows] = layer.get_weights()  # the plain layer's weights, as Keras gives them
    assert rows.shape == (60, 4)
    layer.set_weights([rows + 1.0])
    np.testing.assert_array_equal(layer.get_weights()[0], rows + 1.0)
    with pytest.raises(ValueError, match=r"'emb_b' has 1 weight"):
        layer.set_weights([rows, rows])
    # Keras's clone_model builds new layers and a new model from the classes: they come out plain
    clone = tf.keras.models.clone_model(model)
    assert not htf.keras.is_optimized(clone) and not any(is_captured(x) for x in clone.layers)
    clone.set_weights(model.get_weights())
    x = {k: v for k, v in _batch().items() if k in "abc"}
    # the fused dense sums the same products in another order: compare within 1e-5 of the terms' magnitude (a
    # relative check on the output alone fails whenever a randomly initialized output lands near zero)
    dense = clone.layers[-1]
    features = tf.keras.Model(clone.inputs, dense.input).predict_on_batch(x)
    kernel, bias = dense.get_weights()
    terms = np.abs(features) @ np.abs(kernel) + np.abs(bias)
    np.testing.assert_array_less(np.abs(clone.predict_on_batch(x) - model.predict_on_batch(x)), 1e-5 * terms + 1e-30)
    assert htf.keras.is_optimized(htf.keras.optimize(clone))
    # a packed table frozen after optimize() cannot be frozen alone: compile says so instead of training it
    layer.trainable = False
    with pytest.raises(ValueError, match=r"\['emb_b'\] were packed while trainable and frozen afterwards"):
        model.compile(optimizer="adagrad", loss="binary_crossentropy")


def _towers_repeating_a_layer_name():
    def tower(tag):
        ids = tf.keras.Input((1,), dtype=tf.int64)
        e = tf.keras.layers.Embedding(50, 4, name="emb")(ids)
        d = htf.layers.DynamicEmbedding(4, hot_rows=8, name=f"dyn_{tag}")(ids)
        return tf.keras.Model(ids, tf.keras.layers.Flatten()(e + d), name=f"tower_{tag}")

    a, b = (tf.keras.Input((1,), dtype=tf.int64, name=n) for n in "ab")
    ta, tb = tower("a"), tower("b")
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([ta(a), tb(b)]))
    return tf.keras.Model([a, b], out), ta, tb


def test_exclude_by_table_qualified_name_or_layer_and_ambiguous_names_are_errors():
    """Sub-models that repeat a layer name: 'emb' is two tables, so it is an error listing both."""
    model, _, _ = _towers_repeating_a_layer_name()
    with pytest.raises(ValueError, match=r"'emb', which 2 embedding layers answer to: 'tower_a\.emb'.*'tower_b\.emb'"):
        htf.keras.optimize(model, exclude=["emb"])
    model, ta, _ = _towers_repeating_a_layer_name()
    htf.keras.optimize(model, exclude=["tower_b.emb", ta.get_layer("dyn_a")])
    assert [u.name for u in model.hybridtf_plan.unpacked] == ["tower_b.emb"]
    excluded = {s.name for s in model.hybridtf_skipped if s.reason.startswith("excluded by user")}
    assert excluded == {"tower_b.emb", "dyn_a"}
    model, ta, _ = _towers_repeating_a_layer_name()
    htf.keras.optimize(model, exclude=[ta.get_layer("emb"), "dyn_b"])
    assert [u.name for u in model.hybridtf_plan.unpacked] == ["emb"]
    excluded = {s.name for s in model.hybridtf_skipped if s.reason.startswith("excluded by user")}
    assert excluded == {"emb", "dyn_b"}
    for bad, error, message in (
        (["nope"], ValueError, r"'nope', which is not an embedding table of this model; its tables: 'dyn_a', 'dyn_b'"),
        ("emb", TypeError, r"collection of table names or layers"),
        ([3], TypeError, r"entries are table names or layers, got int"),
    ):
        with pytest.raises(error, match=message):
            htf.keras.optimize(_towers_repeating_a_layer_name()[0], exclude=bad)
    model = _towers_repeating_a_layer_name()[0]
    with pytest.raises(ValueError, match=r"layer 'dense.*' \(Dense\), which is not an embedding table"):
        htf.keras.optimize(model, exclude=[model.layers[-1]])


def _histograms(logdir) -> dict:
    from tensorflow.core.util import event_pb2

    found = {}
    for path in sorted((logdir / "train").glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            for value in event_pb2.Event.FromString(record.numpy()).summary.value:
                if value.tag.endswith("/histogram"):
                    found[value.tag] = tf.make_ndarray(value.tensor)
    return found


def test_tensorboard_histograms_include_the_packed_tables(tmp_path):
    """Keras logs each top-level layer's weights; a packed layer holds none, so its table is logged as well."""
    tf.keras.utils.set_random_seed(3)
    plain = _model()
    wrapped = _model()
    wrapped.set_weights(plain.get_weights())
    wrapped = htf.keras.optimize(wrapped)
    for label, model in (("plain", plain), ("wrapped", wrapped)):
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        callback = tf.keras.callbacks.TensorBoard(str(tmp_path / label), histogram_freq=1)
        model.fit(_batch(), tf.ones([16, 1]), verbose=0, epochs=2, batch_size=8, callbacks=[callback])
    plain_logs, wrapped_logs = _histograms(tmp_path / "plain"), _histograms(tmp_path / "wrapped")
    assert len(wrapped_logs) == len(plain_logs)  # the Dense layers' (named dense / dense_1) and the tables'
    tables = {f"emb_{k}/embeddings_0/histogram" for k in "abcd"}
    assert tables <= set(plain_logs) and tables <= set(wrapped_logs)
    for tag in tables:  # [buckets, (left, right, count)]: the same table values
        np.testing.assert_allclose(wrapped_logs[tag], plain_logs[tag], rtol=1e-5, atol=1e-6, err_msg=tag)


def test_the_skipped_tables_warning_counts_dynamic_tables_as_packed(caplog):
    ids = {name: tf.keras.Input(shape=(), dtype=tf.int64, name=name) for name in ("a", "h", "u", "d")}
    emb_a = tf.keras.layers.Embedding(50, 4, name="emb_a")(ids["a"])
    emb_h = htf.layers.DynamicEmbedding(4, name="dyn_h")(ids["h"])  # two of the same dim: one store
    emb_u = htf.layers.DynamicEmbedding(4, name="dyn_u")(ids["u"])
    emb_d = tf.keras.layers.Embedding(80, 4, name="emb_d", embeddings_regularizer=lambda w: 0.01 * tf.reduce_sum(w))
    x = tf.keras.layers.Concatenate()([emb_a, emb_h, emb_u, emb_d(ids["d"])])
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(x))
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        model = htf.keras.optimize(model)
    [record] = [r for r in caplog.records if r.name == "hybridtf" and "left" in r.getMessage()]
    message = record.getMessage()
    assert "packed 3 embedding table(s) and left 1 unpacked" in message and "emb_d" in message
    assert [s.name for s in model.hybridtf_skipped] == ["emb_d"]


class _TiedOutput(tf.keras.layers.Layer):
    """An output projection tied to an embedding table (holds the table's variable as its own weight)."""

    def __init__(self, emb, by_index=False, **kwargs):
        super().__init__(**kwargs)
        self.emb, self.by_index = emb, by_index
        if not by_index:
            self.kernel = emb.embeddings

    def call(self, h):
        kernel = self.emb.weights[0] if self.by_index else self.kernel
        return tf.matmul(h, kernel, transpose_b=True)


def _tied_model(by_index=False):
    tf.keras.utils.set_random_seed(3)
    ids = tf.keras.Input((4,), dtype="int32")
    emb = tf.keras.layers.Embedding(40, 8, name="tok")
    h = tf.keras.layers.Dense(8, name="proj")(tf.keras.layers.GlobalAveragePooling1D()(emb(ids)))
    model = tf.keras.Model(ids, _TiedOutput(emb, by_index, name="tied")(h))
    model.compile(tf.keras.optimizers.Adam(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _same_token_steps(plain, optimized, steps, rtol=1e-6):
    """``steps`` train_on_batch calls of both models on the same random [16, 4] token batches: equal losses."""
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x, y = rng.integers(0, 40, (16, 4)).astype("int32"), rng.integers(0, 40, (16,)).astype("int32")
        np.testing.assert_allclose(optimized.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=rtol)


def test_a_table_tied_to_another_layer_stays_unpacked_and_trains_as_the_plain_model():
    plain, optimized = _tied_model(), htf.keras.optimize(_tied_model())
    [skipped] = optimized.hybridtf_skipped
    assert skipped.name == "tok" and "also a weight of 'tied'" in skipped.reason
    _same_token_steps(plain, optimized, 5)
    np.testing.assert_allclose(optimized.get_layer("tok").get_weights()[0], plain.get_layer("tok").get_weights()[0])


def _functional_reader_model(op):
    """A functional model that applies a TensorFlow op to the table variable itself (a ``TFOpLambda`` node)."""
    tf.keras.utils.set_random_seed(5)
    a, b = tf.keras.Input((1,), dtype="int64", name="a"), tf.keras.Input((1,), dtype="int64", name="b")
    emb = tf.keras.layers.Embedding(50, 4, name="tok")
    other = tf.keras.layers.Embedding(30, 4, name="other")
    feats = [emb(a), other(b)]
    if op == "lookup":
        feats.append(tf.nn.embedding_lookup(emb.embeddings, b))
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(f) for f in feats])
    h = tf.keras.layers.Dense(4, name="proj")(x)
    out = tf.matmul(h, emb.embeddings, transpose_b=True) if op == "matmul" else tf.keras.layers.Dense(50)(h)
    model = tf.keras.Model([a, b], out)
    model.compile(tf.keras.optimizers.Adam(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("op", ["lookup", "matmul"])
def test_a_table_a_functional_model_applies_an_op_to_stays_unpacked_and_exact(op):
    """tf.nn.embedding_lookup / tf.matmul on ``layer.embeddings`` in a functional model read the unpacked variable."""
    plain, optimized = _functional_reader_model(op), htf.keras.optimize(_functional_reader_model(op))
    [skipped] = optimized.hybridtf_skipped
    reader = r"tf\.compat\.v1\.nn\.embedding_lookup" if op == "lookup" else r"tf\.linalg\.matmul"
    assert skipped.name == "tok" and re.search(rf"applies '{reader}(_\d+)?' to its table variable", skipped.reason)
    assert [m.name for pt in optimized.hybridtf_plan.packed_tables for m in pt.members] == ["other"]
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = [rng.integers(0, 30, (16, 1)), rng.integers(0, 30, (16, 1))]
        y = rng.integers(0, 50, (16,))
        np.testing.assert_allclose(optimized.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-5)
    np.testing.assert_allclose(
        optimized.get_layer("tok").get_weights()[0], plain.get_layer("tok").get_weights()[0], rtol=1e-5, atol=1e-7
    )


def test_a_table_a_layer_indexes_by_weights_in_its_call_stays_unpacked_and_exact():
    plain, optimized = _tied_model(by_index=True), htf.keras.optimize(_tied_model(by_index=True))
    [skipped] = optimized.hybridtf_skipped
    assert skipped.name == "tok" and "the call of 'tied' reads its table variable" in skipped.reason
    _same_token_steps(plain, optimized, 3)


class _TiedWithLoss(tf.keras.layers.Layer):
    """Tied output weights read in ``call``, which also adds a loss (Keras's call context is needed)."""

    def __init__(self, emb, **kwargs):
        super().__init__(**kwargs)
        self.emb = emb

    def call(self, h):
        self.add_loss(1e-3 * tf.reduce_sum(tf.square(h)))
        return tf.matmul(h, self.emb.embeddings, transpose_b=True)


def test_a_call_that_adds_a_loss_is_traced_too_and_the_models_losses_stay():
    def build():
        tf.keras.utils.set_random_seed(3)
        ids = tf.keras.Input((4,), dtype="int32")
        emb = tf.keras.layers.Embedding(40, 8, name="tok")
        other = tf.keras.layers.Embedding(40, 8, name="other")
        h = tf.keras.layers.Add()([emb(ids), other(ids)])
        h = tf.keras.layers.Dense(8, activity_regularizer="l2")(tf.keras.layers.GlobalAveragePooling1D()(h))
        model = tf.keras.Model(ids, _TiedWithLoss(emb, name="tied")(h))
        model(np.zeros((2, 4), "int32"))  # an eager call: model.losses holds its values
        return model

    plain, optimized = build(), build()
    before = [float(loss) for loss in optimized.losses]
    optimized = htf.keras.optimize(optimized)
    assert [float(loss) for loss in optimized.losses] == before and len(before) == 2
    [skipped] = optimized.hybridtf_skipped
    assert skipped.name == "tok" and "the call of 'tied' reads its table variable" in skipped.reason
    assert [m.name for pt in optimized.hybridtf_plan.packed_tables for m in pt.members] == ["other"]
    for m in (plain, optimized):
        m.compile(tf.keras.optimizers.Adam(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _same_token_steps(plain, optimized, 3)

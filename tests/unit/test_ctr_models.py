"""Synthetic CTR data (hybridtf/_src/models/ctr_data.py) and the example Keras CTR models (hybridtf.models)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridtf._src.models.ctr_data import (
    CRITEO_CARDINALITIES,
    DENSE_KEY,
    FieldSpec,
    RaggedIds,
    criteo_like_fields,
    din_fields,
    generate_batch,
    generate_batches,
    make_dataset,
    many_fields,
)
from hybridtf.models import (
    MODELS,
    SUBCLASSED_MODELS,
    AttentionPooling,
    DLRMModel,
    DotInteraction,
    FMInteraction,
    RaggedPooling,
    WideAndDeepModel,
    din_like,
)

N_DENSE = 3
BATCH = 16

# Tiny schema every model accepts: equal dims, a DIN pair (hist_item -> item), a second multi-hot field.
TINY = [
    FieldSpec("user", vocab=20, dim=4),
    FieldSpec("ctx", vocab=3, dim=4),
    FieldSpec("item", vocab=30, dim=4),
    FieldSpec("hist_item", vocab=30, dim=4, kind="multi_hot", max_len=5, mean_len=2.0),
    FieldSpec("tags", vocab=9, dim=4, kind="multi_hot", max_len=3, mean_len=1.0, combiner="sqrtn"),
]
MIXED = [
    FieldSpec("a", vocab=11, dim=4),
    FieldSpec("b", vocab=13, dim=8),
    FieldSpec("c", vocab=7, dim=2, kind="multi_hot", max_len=4, mean_len=2.0, combiner="sum"),
]
BUILDERS = [
    *(("functional", k, b) for k, b in MODELS.items()),
    *(("subclassed", k, b) for k, b in SUBCLASSED_MODELS.items()),
]
BUILDER_IDS = [f"{kind}-{key}" for kind, key, _ in BUILDERS]


def _first_batch(fields=TINY, n_dense=N_DENSE, seed=0):
    return next(iter(make_dataset(fields, n_dense, BATCH, 1, seed=seed)))


def _to_numpy(features):
    out = {}
    for name, value in features.items():
        if isinstance(value, tf.RaggedTensor):
            out[name] = (value.values.numpy(), value.row_lengths().numpy())
        else:
            out[name] = value.numpy()
    return out


def _assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        for part_x, part_y in zip(x, y) if isinstance(x, tuple) else [(x, y)]:
            np.testing.assert_array_equal(part_x, part_y)


# --------------------------------------------------------------------------- data: schemas


def test_criteo_like_fields_caps_the_published_cardinalities():
    fields = criteo_like_fields(dim=8, max_vocab=1000)
    assert [f.name for f in fields] == [f"C{i}" for i in range(1, 27)]
    assert [f.vocab for f in fields] == [min(c, 1000) for c in CRITEO_CARDINALITIES]
    assert {(f.dim, f.kind) for f in fields} == {(8, "one_hot")}
    assert [f.vocab for f in criteo_like_fields(max_vocab=None)] == list(CRITEO_CARDINALITIES)


def test_many_fields_mixes_dims_vocabs_and_multi_hot():
    fields = many_fields(n_fields=60, dims=(8, 16, 32), multi_hot_fraction=0.25, vocab_range=(50, 5000), seed=3)
    assert len(fields) == 60 and len({f.name for f in fields}) == 60
    assert sum(f.multi_hot for f in fields) == 15
    assert {f.dim for f in fields} == {8, 16, 32}
    assert all(50 <= f.vocab <= 5000 for f in fields)
    assert len({f.vocab for f in fields}) > 30
    assert fields == many_fields(n_fields=60, dims=(8, 16, 32), multi_hot_fraction=0.25, vocab_range=(50, 5000), seed=3)
    assert fields != many_fields(n_fields=60, dims=(8, 16, 32), multi_hot_fraction=0.25, vocab_range=(50, 5000), seed=4)


def test_din_fields_pairs_sequences_with_targets():
    by_name = {f.name: f for f in din_fields(dim=8, n_items=500, n_cates=20)}
    assert by_name["hist_item"].multi_hot and not by_name["item"].multi_hot
    assert by_name["hist_item"].vocab == by_name["item"].vocab == 500
    assert by_name["hist_cate"].vocab == by_name["cate"].vocab == 20


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "dense", "vocab": 5}, "identifier other than"),
        ({"name": "x-y", "vocab": 5}, "identifier other than"),
        ({"name": "x", "vocab": 0}, "vocab >= 1"),
        ({"name": "x", "vocab": 5, "kind": "two_hot"}, "kind must be"),
        ({"name": "x", "vocab": 5, "max_len": 3}, "one-hot field has max_len 1"),
        ({"name": "x", "vocab": 5, "kind": "multi_hot", "max_len": 3, "mean_len": 4}, "mean_len <= max_len"),
        ({"name": "x", "vocab": 5, "kind": "multi_hot", "max_len": 3, "combiner": "max"}, "combiner must be"),
    ],
)
def test_field_spec_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FieldSpec(**kwargs)


def test_duplicate_field_names_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        generate_batch([FieldSpec("a", 5), FieldSpec("a", 7)], 0, 4, 0)
    with pytest.raises(ValueError, match="unique"):
        MODELS["wdl"]([FieldSpec("a", 5), FieldSpec("a", 7)], 0)


# --------------------------------------------------------------------------- data: batches


def test_dataset_shapes_and_dtypes():
    features, labels = _first_batch()
    assert set(features) == {f.name for f in TINY} | {DENSE_KEY}
    for f in TINY:
        x = features[f.name]
        if f.multi_hot:
            assert isinstance(x, tf.RaggedTensor) and x.ragged_rank == 1
            assert x.shape.as_list() == [BATCH, None] and x.dtype == tf.int64
        else:
            assert isinstance(x, tf.Tensor) and x.shape == (BATCH,) and x.dtype == tf.int64
    assert features[DENSE_KEY].shape == (BATCH, N_DENSE) and features[DENSE_KEY].dtype == tf.float32
    assert np.all(np.isfinite(features[DENSE_KEY].numpy()))
    assert labels.shape == (BATCH, 1) and labels.dtype == tf.float32
    assert set(np.unique(labels.numpy())) <= {0.0, 1.0}


def test_no_dense_key_without_dense_features():
    features, _ = _first_batch(n_dense=0)
    assert DENSE_KEY not in features


@settings(max_examples=25, deadline=None)
@given(
    vocab=st.integers(1, 300),
    max_len=st.integers(1, 12),
    mean_frac=st.floats(0.0, 1.0),
    batch_size=st.integers(1, 40),
    index=st.integers(0, 1000),
    seed=st.integers(0, 2**31 - 1),
)
def test_ids_within_vocab_and_lengths_within_max_len(vocab, max_len, mean_frac, batch_size, index, seed):
    fields = [
        FieldSpec("one", vocab=vocab),
        FieldSpec("many", vocab=vocab, kind="multi_hot", max_len=max_len, mean_len=mean_frac * max_len),
    ]
    features, labels = generate_batch(fields, 2, batch_size, index, seed=seed)
    one, many = features["one"], features["many"]
    assert one.dtype == np.int64 and one.shape == (batch_size,)
    assert isinstance(many, RaggedIds) and many.values.dtype == np.int64
    assert many.row_lengths.shape == (batch_size,)
    assert np.all((many.row_lengths >= 0) & (many.row_lengths <= max_len))
    assert many.values.size == many.row_lengths.sum() == many.row_splits[-1]
    for ids in (one, many.values):
        assert np.all((ids >= 0) & (ids < vocab))
    assert labels.shape == (batch_size, 1)


def test_batches_are_deterministic_by_seed_and_prefix_stable():
    def batches(seed, n):
        return [(_to_numpy(x), y.numpy()) for x, y in make_dataset(TINY, N_DENSE, BATCH, n, seed=seed)]

    a, b, longer, other = batches(5, 2), batches(5, 2), batches(5, 3), batches(6, 2)
    for (xa, ya), (xb, yb), (xl, yl) in zip(a, b, longer):
        _assert_batches_equal(xa, xb)
        _assert_batches_equal(xa, xl)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(ya, yl)
    assert not np.array_equal(a[0][0]["user"], other[0][0]["user"])
    assert not np.array_equal(a[0][0]["user"], a[1][0]["user"])


def test_numpy_batches_equal_the_dataset():
    dataset = make_dataset(TINY, N_DENSE, BATCH, 2, seed=9)
    for (x, y), (xn, yn) in zip(dataset, generate_batches(TINY, N_DENSE, BATCH, 2, seed=9)):
        got = _to_numpy(x)
        want = {k: (v.values, v.row_lengths) if isinstance(v, RaggedIds) else v for k, v in xn.items()}
        _assert_batches_equal(got, want)
        np.testing.assert_array_equal(y.numpy(), yn)


def test_ids_are_zipf_skewed():
    vocab, n = 1000, 50_000
    features, _ = generate_batch([FieldSpec("x", vocab=vocab, alpha=1.1)], 0, n, 0)
    counts = np.bincount(features["x"], minlength=vocab)
    assert counts.max() / n > 30 / vocab  # the hottest id is far above uniform frequency
    assert np.sort(counts)[::-1][:10].sum() / n > 0.3  # 1% of the ids carry > 30% of the lookups
    assert np.argmax(counts) != 0  # scattered: the hot id is not simply 0


def test_labels_are_balanced_and_follow_a_shared_true_model():
    ys = [y for _, y in generate_batches(criteo_like_fields(max_vocab=1000), 13, 512, 4, seed=1)]
    assert 0.2 < np.mean(ys) < 0.8
    # Same label_seed: the same id gets the same click rate in two streams; another label_seed changes it.
    fields = [FieldSpec("x", vocab=8)]

    def ctr(seed, label_seed):
        x, y = generate_batch(fields, 0, 20_000, 0, seed=seed, signal=3.0, label_seed=label_seed)
        return np.array([y[x["x"] == i].mean() for i in range(8)])

    assert np.abs(ctr(1, 0) - ctr(2, 0)).max() < 0.1
    assert np.abs(ctr(1, 0) - ctr(1, 7)).max() > 0.2


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("kind,key,builder", BUILDERS, ids=BUILDER_IDS)
def test_model_compiles_and_fits(kind, key, builder):
    model = builder(TINY, N_DENSE, hidden=(8,), seed=1)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    history = model.fit(make_dataset(TINY, N_DENSE, BATCH, 3, seed=2), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.optimizer.iterations.numpy() == 3
    features, _ = _first_batch()
    prob = model(features).numpy()
    assert prob.shape == (BATCH, 1) and np.all((prob > 0) & (prob < 1))


@pytest.mark.parametrize("kind,key,builder", BUILDERS, ids=BUILDER_IDS)
def test_same_seed_same_initial_predictions_and_names(kind, key, builder):
    features, _ = _first_batch()
    a, b, c = builder(TINY, N_DENSE, seed=4), builder(TINY, N_DENSE, seed=4), builder(TINY, N_DENSE, seed=5)
    pa, pb, pc = a(features).numpy(), b(features).numpy(), c(features).numpy()
    np.testing.assert_array_equal(pa, pb)
    assert not np.allclose(pa, pc)
    assert [w.name for w in a.weights] == [w.name for w in b.weights]
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(wa.numpy(), wb.numpy())


@pytest.mark.parametrize("kind,key,builder", BUILDERS, ids=BUILDER_IDS)
def test_every_field_is_a_stock_keras_embedding_named_after_it(kind, key, builder):
    model = builder(TINY, N_DENSE, seed=0)
    model(_first_batch()[0])
    names = {layer.name for layer in model.submodules if isinstance(layer, tf.keras.layers.Embedding)}
    shared = {"hist_item"} if key == "din" else set()  # DIN looks hist_item up in item's table
    assert {f"emb_{f.name}" for f in TINY if f.name not in shared} <= names


@pytest.mark.parametrize(
    "key,functional,subclassed", [("wdl", MODELS["wdl"], WideAndDeepModel), ("dlrm", MODELS["dlrm"], DLRMModel)]
)
def test_subclassed_equals_functional(key, functional, subclassed):
    for fields in (TINY, MIXED):
        features, _ = _first_batch(fields)
        np.testing.assert_array_equal(
            functional(fields, N_DENSE, seed=3)(features), subclassed(fields, N_DENSE, seed=3)(features)
        )


@pytest.mark.parametrize("cls", [WideAndDeepModel, DLRMModel])
def test_subclassed_config_round_trip(cls):
    model = cls(MIXED, N_DENSE, hidden=(8, 4), seed=2)
    config = json.loads(json.dumps(model.get_config()))
    clone = cls.from_config(config)
    features, _ = _first_batch(MIXED)
    np.testing.assert_array_equal(model(features), clone(features))


@pytest.mark.parametrize("key", ["deepfm", "dlrm"])
def test_mixed_dims_are_projected_to_a_common_width(key):
    model = MODELS[key](MIXED, N_DENSE, seed=0)
    assert model(_first_batch(MIXED)[0]).shape == (BATCH, 1)
    names = {layer.name for layer in model.submodules}
    assert {"proj_a", "proj_c"} <= names and "proj_b" not in names  # common width = max dim = 8
    equal = MODELS[key](TINY, N_DENSE, seed=0)
    assert not any(layer.name.startswith("proj_") for layer in equal.submodules)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_models_without_dense_features(key):
    features, _ = _first_batch(n_dense=0)
    assert MODELS[key](TINY, 0, seed=0)(features).shape == (BATCH, 1)


def test_din_shares_the_target_table_and_attends():
    shared = din_like(TINY, N_DENSE, seed=0)
    names = {layer.name for layer in shared.layers}
    assert {"emb_item", "att_hist_item", "pool_tags"} <= names
    assert "emb_hist_item" not in names and "pool_hist_item" not in names
    separate = din_like(TINY, N_DENSE, share_embeddings=False, seed=0)
    assert "emb_hist_item" in {layer.name for layer in separate.layers}
    with pytest.raises(ValueError, match="at least one"):
        din_like([f for f in TINY if f.name != "item"], N_DENSE)


def test_models_learn_the_synthetic_task():
    model = MODELS["wdl"](TINY, N_DENSE, hidden=(16,), seed=3)
    model.compile(tf.keras.optimizers.Adagrad(0.05), "binary_crossentropy", metrics=[tf.keras.metrics.AUC(name="auc")])
    model.fit(make_dataset(TINY, N_DENSE, 64, 40, seed=1).cache(), epochs=2, verbose=0)
    _, auc = model.evaluate(make_dataset(TINY, N_DENSE, 256, 2, seed=2), verbose=0)
    assert auc > 0.6


# --------------------------------------------------------------------------- layers vs numpy


def test_ragged_pooling_combiners_and_empty_rows():
    x = tf.ragged.constant([[[1.0, 2.0], [3.0, 4.0]], [], [[5.0, 6.0]]], ragged_rank=1)
    sums = np.array([[4.0, 6.0], [0.0, 0.0], [5.0, 6.0]])
    lengths = np.array([[2.0], [1.0], [1.0]])
    np.testing.assert_allclose(RaggedPooling("sum")(x), sums)
    np.testing.assert_allclose(RaggedPooling("mean")(x), sums / lengths)
    np.testing.assert_allclose(RaggedPooling("sqrtn")(x), sums / np.sqrt(lengths), rtol=1e-6)


def test_fm_and_dot_interactions_match_pairwise_sums():
    rng = np.random.default_rng(0)
    vs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(4)]
    pairs = list(itertools.combinations(range(4), 2))
    dots = np.stack([np.sum(vs[i] * vs[j], axis=1) for i, j in pairs], axis=1)
    np.testing.assert_allclose(DotInteraction()(vs), dots, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(FMInteraction()(vs), dots.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_attention_pooling_ignores_padding():
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 0, 1, 5)]
    query = rng.standard_normal((4, 4)).astype(np.float32)
    layer = AttentionPooling(hidden=(6,), seed=0)
    keys = tf.RaggedTensor.from_row_lengths(np.concatenate(rows), [len(r) for r in rows])
    batched = layer([query, keys]).numpy()
    for i, row in enumerate(rows):
        alone = layer([query[i : i + 1], tf.constant(row[None].reshape(1, -1, 4))]).numpy()
        np.testing.assert_allclose(batched[i : i + 1], alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batched[1], 0.0)

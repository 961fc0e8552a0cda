"""Shared unique ids: packed tables looked up with the same ids reuse one UniquePartition, with the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models
from tests.integration.step_ops import step_op_types

BATCH, STEPS = 64, 25


def _fields():
    # one-hot and multi-hot (ragged) fields, two deep dims: three packed tables (wide, 4d, 8d)
    return ctr_data.many_fields(12, dims=(4, 8), multi_hot_fraction=0.25, vocab_range=(20, 300), max_len=6, seed=5)


def _data(fields, n_dense):
    batches = ctr_data.generate_batches(fields, n_dense, BATCH, STEPS, seed=11)
    return [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in batches]


def _train(model, batches):
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


@pytest.mark.parametrize("fuse_concat", [True, False])
def test_wdl_shared_is_bitwise_equal_to_unshared_and_exact_vs_plain(fuse_concat):
    fields = _fields()
    batches = _data(fields, 3)
    build = lambda: ctr_models.wide_and_deep(fields, 3, hidden=(16, 8), seed=2)  # noqa: E731
    plain, shared, unshared = build(), build(), build()
    for m in (plain, shared, unshared):
        m(batches[0][0])
    shared = htf.keras.optimize(shared, fuse_concat=fuse_concat)
    unshared = htf.keras.optimize(unshared, fuse_concat=fuse_concat, share_unique=False)
    losses = {name: _train(m, batches) for name, m in [("plain", plain), ("shared", shared), ("unshared", unshared)]}
    deep_tables = {pt.name for pt in shared.hybridtf_plan.packed_tables if pt.dim != 1}
    wide_table = next(pt.name for pt in shared.hybridtf_plan.packed_tables if pt.dim == 1)
    assert len(deep_tables) == 2
    assert shared.hybridtf_shared_uniques == {name: wide_table for name in deep_tables}
    assert unshared.hybridtf_shared_uniques == {}
    np.testing.assert_array_equal(losses["shared"], losses["unshared"])
    for a, b in zip(shared.get_weights(), unshared.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(losses["shared"], losses["plain"], rtol=1e-5, atol=0)
    x = batches[-1][0]
    np.testing.assert_allclose(shared.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-5, atol=1e-6)


def test_shared_step_runs_one_unique_partition():
    fields = _fields()
    batches = _data(fields, 3)
    counts = {}
    for share in (True, False):
        model = ctr_models.wide_and_deep(fields, 3, hidden=(16, 8), seed=2)
        model(batches[0][0])
        model = htf.keras.optimize(model, share_unique=share)
        model.compile(optimizer="adagrad", loss="binary_crossentropy")
        types = step_op_types(model, batches)
        counts[share] = {t: types.count(t) for t in ("HybridTF>UniquePartition", "HybridTF>UniqueSubset")}
        counts[share]["HybridTF>PackIds"] = types.count("HybridTF>PackIds")
    assert counts[False] == {"HybridTF>UniquePartition": 3, "HybridTF>UniqueSubset": 0, "HybridTF>PackIds": 3}
    assert counts[True] == {"HybridTF>UniquePartition": 1, "HybridTF>UniqueSubset": 2, "HybridTF>PackIds": 1}


def _two_table_model(wide_vocab, deep_vocab):
    ids = tf.keras.Input((1,), dtype=tf.int64, name="ids")
    wide = tf.keras.layers.Embedding(wide_vocab, 1, name="wide")(ids)
    deep = tf.keras.layers.Embedding(deep_vocab, 4, name="deep")(ids)
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(wide), tf.keras.layers.Flatten()(deep)])
    out = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones")(x)
    return tf.keras.Model(ids, out)


def test_different_vocabularies_do_not_share():
    """Same ids but tables of different sizes: each keeps its own chain (and its own vocabulary check)."""
    model = _two_table_model(50, 40)
    x = tf.constant([[1], [3], [39]], tf.int64)
    model(x)
    model = htf.keras.optimize(model)
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    model.train_on_batch(x, tf.ones([3, 1]))
    assert model.hybridtf_shared_uniques == {}
    with pytest.raises(tf.errors.InvalidArgumentError, match="deep"):
        model.train_on_batch(tf.constant([[45]], tf.int64), tf.ones([1, 1]))


def test_shared_chain_still_rejects_out_of_vocabulary_ids():
    model = _two_table_model(40, 40)
    x = tf.constant([[1], [3], [39]], tf.int64)
    model(x)
    model = htf.keras.optimize(model)
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    model.train_on_batch(x, tf.ones([3, 1]))
    assert len(model.hybridtf_shared_uniques) == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"out of|outside|vocab"):
        model.train_on_batch(tf.constant([[40]], tf.int64), tf.ones([1, 1]))

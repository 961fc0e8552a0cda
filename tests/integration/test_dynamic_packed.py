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
    return {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.1), "adam": lambda: tf.keras.optimizers.Adam(0.01)}[kind]()


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


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
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

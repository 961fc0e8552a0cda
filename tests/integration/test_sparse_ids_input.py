"""A Keras ``Embedding`` fed a ``tf.SparseTensor`` of ids (``tf.keras.Input(sparse=True)``) packs and trains exactly.

Keras looks each position up as a bag of at most one id (``safe_embedding_lookup_sparse``, ``default_id=0``):
negative ids are pruned and an empty position gets row 0. The packed layer was planned, then raised
``TypeError`` at every step and call; it now looks up the same dense ids (empty and negative positions set
to 0), so outputs, gradients and updates are the plain model's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

BATCH, WIDTH, VOCAB, STEPS = 32, 5, 60, 12


def _sparse_batch(rng, n):
    indices, values = [], []
    for row in range(n):
        for col in sorted(rng.choice(WIDTH, rng.integers(0, WIDTH + 1), replace=False)):
            indices.append([row, col])
            values.append(rng.integers(-3, VOCAB))  # negative ids are pruned by Keras; some rows empty
    indices = np.array(indices, np.int64).reshape(-1, 2)
    return tf.SparseTensor(indices, np.array(values, np.int64), [n, WIDTH])


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        x = {"tags": _sparse_batch(rng, BATCH), "user": tf.constant(rng.integers(0, VOCAB, (BATCH, 1)))}
        out.append((x, tf.constant((rng.random((BATCH, 1)) < 0.4).astype(np.float32))))
    return out


def _model():
    tf.keras.utils.set_random_seed(3)
    tags = tf.keras.Input((WIDTH,), sparse=True, dtype=tf.int64, name="tags")
    user = tf.keras.Input((1,), dtype=tf.int64, name="user")
    t = tf.keras.layers.Reshape((WIDTH * 8,))(tf.keras.layers.Embedding(VOCAB, 8, name="tags_emb")(tags))
    u = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, 8, name="user_emb")(user))
    h = tf.keras.layers.Dense(16, activation="relu")(tf.keras.layers.Concatenate()([t, u]))
    return tf.keras.Model([tags, user], tf.keras.layers.Dense(1, activation="sigmoid")(h))


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_an_embedding_of_sparse_ids_packs_and_trains_like_the_plain_model(optimizer):
    batches = _batches()
    losses, weights, outputs = {}, {}, {}
    for kind in ("plain", "optimized"):
        model = _model()
        if kind == "optimized":
            model = htf.keras.optimize(model)
            assert not model.hybridtf_skipped
            assert {"tags_emb", "user_emb"} <= {m.split("@")[0] for m in str(model.hybridtf_plan).split()}
        model.compile(tf.keras.optimizers.get({"class_name": optimizer, "config": {"learning_rate": 0.05}}), "mse")
        losses[kind] = [float(model.train_on_batch(x, y)) for x, y in batches]
        outputs[kind] = model(batches[0][0]).numpy()
        weights[kind] = model.get_weights()
    np.testing.assert_allclose(losses["optimized"], losses["plain"], rtol=1e-5)
    np.testing.assert_allclose(outputs["optimized"], outputs["plain"], rtol=1e-5, atol=1e-7)
    for got, want in zip(weights["optimized"], weights["plain"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # row 0 trained (empty and negative positions look it up), as in the plain model
    assert not np.allclose(weights["plain"][0][0], _model().get_weights()[0][0])


def test_a_sparse_id_outside_the_vocabulary_names_the_table():
    model = htf.keras.optimize(_model())
    x = {
        "tags": tf.SparseTensor([[0, 1]], tf.constant([VOCAB], tf.int64), [1, WIDTH]),
        "user": tf.zeros((1, 1), tf.int64),
    }
    with pytest.raises(tf.errors.InvalidArgumentError, match="tags_emb"):
        model(x)

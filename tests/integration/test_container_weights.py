"""Layers that hold packed Embedding layers give their weights in the plain layer's order and shapes.

A custom layer with a list of Embeddings, ``TimeDistributed(Embedding)`` and a tower sub-model gather
their sublayers' variables; a packed layer holds none (its rows live in the packed variable), so their
``get_weights`` returned ``[]`` and ``set_weights`` refused the plain layer's arrays.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import hybridtf as htf

L = tf.keras.layers


class TwoTables(L.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tables = [L.Embedding(20, 4, name=f"e{k}") for k in range(2)]
        self.scale = self.add_weight("scale", (), initializer="ones")

    def call(self, ids):
        return tf.concat([t(ids[:, k]) for k, t in enumerate(self.tables)], axis=-1) * self.scale


def _model():
    tf.keras.utils.set_random_seed(1)
    pair = tf.keras.Input((2,), dtype=tf.int64, name="pair")
    seq = tf.keras.Input((5, 1), dtype=tf.int64, name="seq")
    user = tf.keras.Input((1,), dtype=tf.int64, name="user")
    uid = tf.keras.Input((1,), dtype=tf.int64)
    tower = tf.keras.Model(
        uid, L.Dense(3, name="proj")(L.Flatten()(L.Embedding(40, 4, name="emb_u")(uid))), name="tower"
    )
    parts = [
        TwoTables(name="multi")(pair),
        L.Flatten()(L.TimeDistributed(L.Embedding(50, 4, name="emb_s"), name="td")(seq)),
        tower(user),
    ]
    return tf.keras.Model([pair, seq, user], L.Dense(1)(L.Concatenate()(parts)))


def test_containers_of_packed_layers_get_and_set_their_plain_weights():
    plain, optimized = _model(), htf.keras.optimize(_model())
    assert len(optimized.hybridtf_plan.packed_tables) == 1  # all four tables of dim 4 in one variable
    for name in ("multi", "td", "tower"):
        want, got = plain.get_layer(name).get_weights(), optimized.get_layer(name).get_weights()
        assert [w.shape for w in got] == [w.shape for w in want] and want, name
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert optimized.get_layer(name).count_params() == plain.get_layer(name).count_params()
    new = [np.full_like(w, 0.5 + k) for k, w in enumerate(plain.get_layer("multi").get_weights())]
    optimized.get_layer("multi").set_weights(new)  # the plain layer's arrays: refused before
    plain.get_layer("multi").set_weights(new)
    x = {"pair": np.array([[1, 2], [3, 4]]), "seq": np.arange(10).reshape(2, 5, 1), "user": np.array([[5], [6]])}
    np.testing.assert_allclose(optimized.predict_on_batch(x), plain.predict_on_batch(x), rtol=1e-6)
    np.testing.assert_array_equal(optimized.get_weights()[0].shape, plain.get_weights()[0].shape)

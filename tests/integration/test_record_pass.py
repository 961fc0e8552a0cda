"""The record pass of an optimized Keras model leaves nothing in the real training step.

A Keras functional model conforms its inputs before its layers see them: DeepCTR
declares ``Input(shape=(1,), dtype="int32")`` and is fed ``[B]`` int64 ids, so every
Embedding's ids are ``Cast(ExpandDims(input))``. ``keras_record.lookups_from_inputs``
follows such id-preserving ops back to the inputs and replays them on the real
inputs; before, it gave up, and the model's forward pass was recorded inline in the
training graph. That extra forward pass ran in training mode (Keras's call context,
whatever ``training=False`` the record call passed), so its BatchNormalization layers
updated their moving statistics a second time per step, from zeroed embeddings, and
its stateful ops kept part of the forward alive (DeepCTR DIN's attention unit ran
twice).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.keras
from hybridtf._src.integrations import keras_record

B, VOCAB, DIM = 64, 50, 4


def _model(seed=0, computed_ids=False):
    """``computed_ids``: the ids are computed inside the model (a hash of the input), so the record
    pass cannot map them onto the inputs and runs inline in the training graph."""
    tf.keras.utils.set_random_seed(seed)
    ids = {n: tf.keras.Input(shape=(1,), dtype="int32", name=n) for n in ("a", "b")}
    looked_up = ids
    if computed_ids:
        looked_up = {n: tf.keras.layers.Hashing(VOCAB, name=f"hash_{n}")(ids[n]) for n in ids}
    emb = {n: tf.keras.layers.Embedding(VOCAB, DIM, name=f"emb_{n}")(looked_up[n]) for n in ids}
    x = tf.keras.layers.Flatten()(tf.keras.layers.Concatenate()([emb["a"], emb["b"]]))
    x = tf.keras.layers.Dense(8)(x)
    x = tf.keras.layers.BatchNormalization(name="bn")(x)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.ReLU()(x))
    return tf.keras.Model(ids, out)


def _batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            {n: tf.constant(rng.integers(0, VOCAB, B), tf.int64) for n in ("a", "b")},
            tf.constant(rng.integers(0, 2, (B, 1)).astype("float32")),
        )
        for _ in range(steps)
    ]


def test_ids_through_conforming_ops_map_onto_the_inputs():
    model = hybridtf.keras.optimize(_model())
    x, _ = _batches(1)[0]
    found = {}

    @tf.function(autograph=False)
    def step(inputs):
        found["requests"] = keras_record.lookups_from_inputs(
            model, model._htf_model_call(), inputs, {"training": False}
        )
        return [r.ids for r in found["requests"]]

    ids = step(x)
    assert found["requests"] is not None and len(found["requests"]) == 2
    # the replayed ids are the model's conformed ids: [B, 1] int32, the same values
    for got, name in zip(ids, ("a", "b")):
        assert got.dtype == tf.int32 and got.shape == (B, 1)
        np.testing.assert_array_equal(got.numpy()[:, 0], x[name].numpy())


@pytest.mark.parametrize("computed_ids", [False, True], ids=["input_ids", "ids_computed_inside"])
def test_training_step_has_one_forward_pass_and_batch_norm_statistics_match_plain(computed_ids):
    """Also when the record pass runs inline (ids computed inside): it runs in inference mode."""
    batches = _batches(6)
    plain, packed = _model(computed_ids=computed_ids), hybridtf.keras.optimize(_model(computed_ids=computed_ids))
    if computed_ids:
        assert packed.hybridtf_plan is not None and not packed.hybridtf_skipped
    for m in (plain, packed):
        m.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    expected = [plain.train_on_batch(x, y) for x, y in batches]
    got = [packed.train_on_batch(x, y) for x, y in batches]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    for name in ("moving_mean", "moving_variance"):
        want = next(w for w in plain.get_layer("bn").weights if name in w.name).numpy()
        have = next(w for w in packed.get_layer("bn").weights if name in w.name).numpy()
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        packed.predict_on_batch(batches[0][0]), plain.predict_on_batch(batches[0][0]), rtol=1e-5, atol=1e-7
    )
    graph = packed.train_function.get_concrete_function(iter(tf.data.Dataset.from_tensors(batches[0]))).graph
    moments = [op for op in graph.get_operations() if op.type == "Mean" and "moments" in op.name]
    assert len(moments) == 2  # one BatchNormalization in training mode: mean and variance, once


def test_lookups_of_one_input_share_the_replayed_ids():
    """Wide and deep tables of one conformed input keep sharing one UniquePartition (UniqueSubset)."""
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype="int32", name="a")
    wide = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, 1, name="wide")(ids))
    deep = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM, name="deep")(ids))
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()([wide, deep]))
    model = hybridtf.keras.optimize(tf.keras.Model({"a": ids}, out))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    x, y = _batches(1)[0]
    model.train_on_batch({"a": x["a"]}, y)
    assert model._htf_runtime.shared_uniques  # one packed table takes its unique ids from the other's chain

"""``tf.compat.v1.train.init_from_checkpoint`` of Keras tables in a wrapped model_fn loads them as in the plain one.

Two ways TF1 code writes it: a map to the layers' variable objects (``layer.embeddings``, a view of the packed
variable when wrapped: TensorFlow took it for a scope name and failed), and BERT's map built from the trainable
variables (``{v.op.name: v}``: the record pass's table variables got a restore initializer the real pass could not
copy). Losses over 30 steps within 1e-5 of the plain model_fn, which starts from the pretrained rows.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator_warm_start import DIM, FIELDS, LOSS_KEY, VOCAB, _train
from tests.integration.test_estimator_warm_start import model_fn as pretrain_fn


def _make_model_fn(ckpt, how):
    def model_fn(features, labels, mode):
        layers = [
            tf.keras.layers.Embedding(
                VOCAB,
                DIM,
                embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=i),
                name=f"emb_C{i}",
            )
            for i in range(FIELDS)
        ]
        deep = [layer(features[f"C{i}"]) for i, layer in enumerate(layers)]
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))
        logit = dense(tf.concat(deep, axis=1))
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        if how == "objects":  # table 1 from another table's tensor; tables 2.. keep their own initial rows
            tf.compat.v1.train.init_from_checkpoint(
                ckpt, {"emb_C0/embeddings": layers[0].embeddings, "emb_C3/embeddings": layers[1].embeddings}
            )
        elif how == "bert":
            shapes = dict(tf.train.list_variables(ckpt))
            tf.compat.v1.train.init_from_checkpoint(
                ckpt, {v.op.name: v for v in tf.compat.v1.trainable_variables() if shapes.get(v.op.name) == v.shape}
            )
        elif how == "missing":
            tf.compat.v1.train.init_from_checkpoint(ckpt, {"no_such/embeddings": layers[2].embeddings})
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained")
    _train(pretrain_fn, path, 20, seed=0)
    return str(path)


@pytest.mark.parametrize("how", ["objects", "bert"])
def test_init_from_checkpoint_of_packed_tables_matches_the_plain_model_fn(how, pretrained, tmp_path):
    plain = _train(_make_model_fn(pretrained, how), tmp_path / "plain", 30, seed=1)
    wrapped = _train(htf_estimator.model_fn(_make_model_fn(pretrained, how)), tmp_path / "wrapped", 30, seed=1)
    np.testing.assert_allclose(wrapped, plain, rtol=1e-5)
    cold = _train(_make_model_fn(pretrained, "none"), tmp_path / "cold", 1, seed=1)
    assert abs(plain[0] - cold[0]) > 1e-5  # the pretrained rows changed the model (bert: 6.4e-5)


def test_init_from_checkpoint_of_a_missing_tensor_names_it(pretrained, tmp_path):
    with pytest.raises(ValueError, match=r"init_from_checkpoint: tensor 'no_such/embeddings' \(table 'emb_C2/embed"):
        _train(htf_estimator.model_fn(_make_model_fn(pretrained, "missing")), tmp_path / "w", 1, seed=1)


def test_a_table_read_as_a_tensor_is_reported_once_with_the_reason(tmp_path, caplog):
    """An L2 term over ``layer.embeddings`` leaves the table unpacked: named once, with that reason."""

    def model_fn(features, labels, mode):
        layer = tf.keras.layers.Embedding(VOCAB, DIM, name="emb_l2")
        logit = tf.reduce_sum(layer(features["C0"]), axis=1, keepdims=True)
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
        loss += 1e-4 * tf.nn.l2_loss(layer.embeddings)
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        _train(htf_estimator.model_fn(model_fn), tmp_path / "w", 1, seed=1)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert text.count("emb_l2") == 1 and "L2 term over layer.embeddings" in text and "embeddings_regularizer" in text


def _get_variable_model_fn(assignment_map=None, ckpt=None):
    """Tables of the model_fn's own (``get_variable`` under scope ``tables``), looked up with embedding_lookup."""

    def model_fn(features, labels, mode):
        with tf.compat.v1.variable_scope("tables"):
            tables = [
                tf.compat.v1.get_variable(
                    f"raw_C{i}", [VOCAB, DIM], initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=i)
                )
                for i in range(3)
            ]
        deep = [tf.nn.embedding_lookup(t, features[f"C{i}"]) for i, t in enumerate(tables)]
        init = tf.compat.v1.glorot_uniform_initializer(seed=3)
        logit = tf.compat.v1.layers.dense(tf.concat(deep, 1), 1, kernel_initializer=init, name="out")
        if assignment_map is not None:
            tf.compat.v1.train.init_from_checkpoint(ckpt, assignment_map)
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


@pytest.mark.parametrize(
    "assignment_map",
    [
        {"tables/raw_C0": "tables/raw_C0", "tables/raw_C1": "tables/raw_C2"},  # variable names (one renamed)
        {"tables/": "tables/"},  # a scope: its tables
        {"/": "/"},  # the root: every variable (tables, the dense layer, the global step)
    ],
    ids=["names", "scope", "root"],
)
def test_init_from_checkpoint_by_name_of_get_variable_tables_matches_the_plain_model_fn(assignment_map, tmp_path):
    """String names resolve against the variable store, which holds the packed get_variable tables' views:
    TensorFlow failed on them ('CapturedTable' object is not iterable / has no attribute 'device')."""
    source = tmp_path / "source"
    _train(_get_variable_model_fn(), source, 10, seed=0)
    fn = _get_variable_model_fn(assignment_map, str(source))
    plain = _train(fn, tmp_path / "plain", 15, seed=1)
    wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 15, seed=1)
    np.testing.assert_allclose(wrapped, plain, rtol=1e-5)
    cold = _train(_get_variable_model_fn(), tmp_path / "cold", 1, seed=1)
    assert abs(plain[0] - cold[0]) > 1e-5

"""hybridtf.estimator: moving averages over some tables, and variable lists made of several layers' variables.

A packed variable holds several tables, and every layer packed into it lists it among its variables. So
* a moving average (``ExponentialMovingAverage.apply``) over some of the tables packs them apart from the
  others (their shadow covers exactly the averaged tables), and a Saver restoring the averages of some
  tables in EVAL reads each table where the plain model_fn does;
* ``optimizer.minimize(var_list=layer_a.trainable_variables + layer_b.trainable_variables)`` (and the same
  list given to ``ExponentialMovingAverage.apply``) applies the packed variable once, not once per layer;
  gradients applied from such a list built by hand raise instead of updating the packed variable twice.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from hybridtf._src.capture.context import CaptureError
from tests.integration.test_estimator import (
    FIELDS,
    LOSS_KEY,
    VOCAB,
    _assert_losses_close,
    _graph_spec,
    _init,
    _train,
    input_fn,
)
from tests.integration.test_estimator_optimizers import SPLITS

TRAIN = tf.estimator.ModeKeys.TRAIN


def _averaged_model_fn(pick):
    """Adagrad over everything; a moving average of the deep tables (``pick(deep_layers)``), restored in EVAL."""

    def model_fn(features, labels, mode):
        deep, wide, deep_layers = [], [], []
        for i in range(FIELDS):
            ids = features[f"C{i}"]
            with tf.compat.v1.variable_scope("deep"):
                layer = tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"d{i}")
                deep.append(layer(ids))
                deep_layers.append(layer)
            with tf.compat.v1.variable_scope("wide"):
                wide.append(
                    tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(50 + i), name=f"w{i}")(ids)
                )
        logit = tf.reduce_sum(tf.concat(deep, axis=1), 1, keepdims=True) + tf.reduce_sum(
            tf.add_n(wide), 1, keepdims=True
        )
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
        averaged = pick(deep_layers)
        if mode == TRAIN:
            step = tf.compat.v1.train.get_global_step()
            train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
            with tf.control_dependencies([train]):
                return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ema.apply(averaged))
        saver = tf.compat.v1.train.Saver(ema.variables_to_restore(averaged))
        return tf.estimator.EstimatorSpec(mode, loss=loss, scaffold=tf.compat.v1.train.Scaffold(saver=saver))

    return model_fn


PICKS = {
    "scope": lambda layers: SPLITS["scope"]("deep"),
    "name": lambda layers: SPLITS["name"]("deep"),
    # two layers' variables: a packed variable both layers list
    "layers": lambda layers: [v for layer in layers[:2] for v in layer.trainable_variables],
}


@pytest.mark.parametrize("pick", sorted(PICKS))
def test_a_moving_average_of_some_tables_trains_saves_and_evaluates_as_plain(tmp_path, pick):
    fn = _averaged_model_fn(PICKS[pick])
    _, plain = _train(fn, tmp_path / "plain", 20)
    est, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)
    _assert_losses_close(wrapped, plain)
    keys = dict(tf.train.list_variables(est.model_dir))
    assert keys == dict(tf.train.list_variables(str(tmp_path / "plain")))
    assert "deep/d0/embeddings/ExponentialMovingAverage" in keys
    assert "wide/w0/embeddings/ExponentialMovingAverage" not in keys
    for key in keys:  # the averages too: each updated once a step, after the optimizer
        plain_value = tf.train.load_variable(str(tmp_path / "plain"), key)
        np.testing.assert_allclose(tf.train.load_variable(est.model_dir, key), plain_value, rtol=1e-5, atol=1e-7)
    # EVAL restores the averages of the averaged tables and the others' weights, where the plain model_fn does
    losses = [
        tf.estimator.Estimator(f, model_dir=str(tmp_path / "wrapped")).evaluate(
            lambda: input_fn(repeat=False), steps=5
        )["loss"]
        for f in (fn, htf_estimator.model_fn(fn))
    ]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


def test_a_moving_average_picked_by_layer_names_raises_naming_the_fix():
    """The averaged tables are chosen by their layer names, which the packed variable does not carry."""

    def pick(layers):
        return [v for v in tf.compat.v1.trainable_variables() if v.name.split("/")[-2] in ("d0", "d1")]

    with pytest.raises(CaptureError, match=r"a moving average .* covers table 'd0'.*layer\.trainable_variables"):
        _graph_spec(htf_estimator.model_fn(_averaged_model_fn(pick)))


def _layers_model_fn(apply=False, pick=None, penalty=None, saver=False):
    """Adagrad over ``pick(layers)`` (default: every layer's ``trainable_variables``): minimize or apply_gradients.

    ``penalty(layers)``: variables an L2 term of the loss covers; ``saver``: a Scaffold Saver of ``pick(layers)``.
    """

    def model_fn(features, labels, mode):
        layers = [
            tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"e{i}")
            for i in range(FIELDS)
        ]
        embedded = [layer(features[f"C{i}"]) for i, layer in enumerate(layers)]
        logit = tf.reduce_sum(tf.concat(embedded, axis=1), axis=1, keepdims=True)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        if penalty is not None:
            loss += 1e-2 * tf.add_n([tf.nn.l2_loss(v) for v in penalty(layers)])
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        variables = pick(layers) if pick else [v for layer in layers for v in layer.trainable_variables]
        step = tf.compat.v1.train.get_global_step()
        # locked: a table listed twice gets two updates a step, whose row-wise interleaving would be racy
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.1, use_locking=True)
        if apply:
            train = optimizer.apply_gradients(list(zip(tf.gradients(loss, variables), variables)), global_step=step)
        else:
            train = optimizer.minimize(loss, var_list=variables, global_step=step)
        scaffold = tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver([*variables, step])) if saver else None
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train, scaffold=scaffold)

    return model_fn


VARIABLE_LISTS = {
    "trainable_variables": {},
    "embeddings": {"pick": lambda layers: [layer.embeddings for layer in layers]},  # the tables' views
    "first_table_twice": {  # a repeat of the model_fn's own: that table is updated twice a step, as in plain
        "pick": lambda layers: layers[0].trainable_variables + tf.compat.v1.trainable_variables()
    },
    "saver_of_layers": {"saver": True},  # a Saver of several layers' variables (two of one name otherwise)
    "l2_over_embeddings": {"penalty": lambda layers: [layer.embeddings for layer in layers]},
    "l2_over_all_variables": {"penalty": lambda layers: tf.compat.v1.trainable_variables()},
    # e0's gradient is dense, the others' sparse: e0 is packed apart, its variable holds e0 alone
    "l2_over_one_layer": {"penalty": lambda layers: layers[0].trainable_variables},
}


@pytest.mark.parametrize("case", sorted(VARIABLE_LISTS))
def test_variable_lists_of_layers_train_and_save_as_plain(tmp_path, case):
    fn = _layers_model_fn(**VARIABLE_LISTS[case])
    _, plain = _train(fn, tmp_path / "plain", 10)
    est, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 10)
    _assert_losses_close(wrapped, plain)
    keys = dict(tf.train.list_variables(est.model_dir))
    assert keys == dict(tf.train.list_variables(str(tmp_path / "plain")))
    for key in keys:
        np.testing.assert_allclose(
            tf.train.load_variable(est.model_dir, key),
            tf.train.load_variable(str(tmp_path / "plain"), key),
            rtol=1e-5,
            atol=1e-7,
        )


@pytest.mark.parametrize(
    "penalty",
    [
        lambda layers: [v for layer in layers for v in layer.trainable_variables],  # the packed variable 8 times
        # e0 and e1 (packed together: the penalty's gradient is dense for both) twice, not once each
        lambda layers: layers[0].trainable_variables + layers[1].trainable_variables,
    ],
    ids=["every_layer", "two_layers"],
)
def test_a_loss_term_over_layers_whole_variables_raises_naming_the_fix(penalty):
    with pytest.raises(CaptureError, match=r"loss reads the packed variable .* as a whole \d time.*l2_loss\(layer"):
        _graph_spec(htf_estimator.model_fn(_layers_model_fn(penalty=penalty)))


def test_an_optimizer_given_several_layers_variables_updates_the_packed_variable_once(tmp_path):
    fn = _layers_model_fn()
    _, plain = _train(fn, tmp_path / "plain", 15)
    est, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 15)
    _assert_losses_close(wrapped, plain)
    np.testing.assert_allclose(
        tf.train.load_variable(est.model_dir, "e1/embeddings"),
        tf.train.load_variable(str(tmp_path / "plain"), "e1/embeddings"),
        rtol=1e-5,
        atol=1e-7,
    )


def test_gradients_applied_from_several_layers_variables_raise_naming_the_fix():
    with pytest.raises(CaptureError, match=r"with Adagrad \(\d+ times\) a step.*updates table 'e0' 1 time"):
        _graph_spec(htf_estimator.model_fn(_layers_model_fn(apply=True)))

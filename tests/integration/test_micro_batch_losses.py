"""Micro-batched Keras steps: the losses micro-batching can weight, and the batch statistics it warns about.

A compiled loss that returns one value for the batch is refused unless it is a mean over the micro-batch's
rows (a sum in it, a ``Loss.__call__`` of its own returning a sum, an ``add_loss`` term summing
activations: each was weighted as a mean, silently); means (scaled, keepdims) and one-row micro-batches'
per-row losses train as the whole batch (1e-5); a hand-written batch normalization is warned about.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from tests.integration.test_micro_batch import FIELDS, _batches, _inputs, _losses, _uneven, wide_and_deep


def _summed_bce(y, p):
    return tf.reduce_sum(tf.keras.losses.binary_crossentropy(y, p))


class _SummedBce(tf.keras.losses.Loss):
    def call(self, y_true, y_pred):
        return tf.reduce_sum(tf.keras.losses.binary_crossentropy(y_true, y_pred))


@pytest.mark.parametrize("loss", [_summed_bce, _SummedBce()], ids=["function", "loss_subclass"])
def test_a_loss_returning_one_summed_value_is_refused(loss):
    """Keras trains on the sum as it is; each micro-batch's sum was weighted as a mean (n_i / B): the step's
    gradient shrank N times, silently (a probe: losses 20.8 -> 6.9 x 3 = 20.9 at step 2)."""
    batches, _ = _uneven(steps=1)
    for mode in ("embedding", "mlp", "hidden_1"):
        with pytest.raises(ValueError, match=r"returns one value for the whole batch.*reduction=.sum."):
            _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=4, interleave_from=mode)


def test_a_loss_returning_one_mean_is_accepted_and_exact():
    batches, _ = _uneven()

    def mean_bce(y, p):
        return tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, p))

    whole, _ = _losses(wide_and_deep, "adagrad", batches, loss=mean_bce)
    for mode in ("embedding", "mlp"):
        micro, _ = _losses(wide_and_deep, "adagrad", batches, loss=mean_bce, micro_batches=4, interleave_from=mode)
        np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0, err_msg=mode)
    # with sample weights Keras scales the one value by their mean, which micro-batches cannot split
    batches, weights = _uneven(steps=1)
    with pytest.raises(ValueError, match="sample weights then do not scale rows"):
        _losses(wide_and_deep, "adagrad", batches, loss=mean_bce, weights=weights, micro_batches=2)


class _HandWrittenBatchNorm(tf.keras.layers.Layer):
    def call(self, x):
        mean, variance = tf.nn.moments(x, [0])
        return (x - mean) / tf.sqrt(variance + 1e-3)


@pytest.mark.parametrize("mode", ["embedding", "mlp"])
def test_a_hand_written_batch_normalization_is_told(mode, caplog):
    """hybridtf refuses the Keras layers it can name; a custom layer's statistics over the batch are found in the
    first micro-batch's graph and told (the step differs from the whole batch's: 1.2e-2)."""
    ids, dense = _inputs()
    x = tf.keras.layers.Concatenate()(
        [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(n, 4)(ids[f])) for f, n in FIELDS]
        + [_HandWrittenBatchNorm()(dense)]
    )
    model = tf.keras.Model({**ids, "dense_features": dense}, tf.keras.layers.Dense(1, activation="sigmoid")(x))
    model = htf.keras.optimize(model, micro_batches=2, interleave_from=mode)
    model.compile("sgd", "binary_crossentropy")
    with caplog.at_level("WARNING", logger="hybridtf"):
        model.train_on_batch(*_batches(steps=1)[0])
    [message] = [r.getMessage() for r in caplog.records if "statistics over the batch" in r.getMessage()]
    assert f"model {model.name!r}" in message and "moments" in message


class _SumOverriddenCall(tf.keras.losses.Loss):
    def __call__(self, y_true, y_pred, sample_weight=None):
        return tf.reduce_sum(tf.keras.losses.binary_crossentropy(y_true, y_pred))


@pytest.mark.parametrize(
    "loss",
    [
        lambda y, p: tf.reduce_mean(tf.reduce_sum(tf.keras.losses.binary_crossentropy(y, p))),  # a sum in a mean
        lambda y, p: tf.reduce_mean(tf.reduce_sum(tf.square(y - p), axis=0)),
        _SumOverriddenCall(),  # no call of its own to watch: its value is
    ],
    ids=["mean_of_a_sum", "mean_of_column_sums", "overridden_call"],
)
def test_sums_that_look_like_means_are_refused(loss):
    """A probe's cases: accepted before, with the step's gradient halved at 2 micro-batches."""
    batches, _ = _uneven(steps=1)
    with pytest.raises(ValueError, match="returns one value for the whole batch"):
        _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=2)


@pytest.mark.parametrize(
    "loss",
    [
        lambda y, p: 2.0 * tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, p)),  # scaled by a constant
        lambda y, p: tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, p), keepdims=True),
    ],
    ids=["scaled_mean", "keepdims_mean"],
)
def test_scaled_and_kept_dimension_means_are_accepted_and_exact(loss):
    batches, _ = _uneven(steps=3)
    whole, _ = _losses(wide_and_deep, "adagrad", batches, loss=loss)
    micro, _ = _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=3)
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def _bce(y, p):
    return tf.keras.losses.binary_crossentropy(y, p)


def _mean_over_size(y, p):
    squares = tf.square(y - p)
    return tf.reduce_sum(squares) / tf.cast(tf.size(squares), tf.float32)


@pytest.mark.parametrize(
    "loss",
    [
        lambda y, p: tf.reduce_sum(_bce(y, p)) / tf.cast(tf.shape(y)[0], tf.float32),
        lambda y, p: tf.nn.compute_average_loss(_bce(y, p)),
        _mean_over_size,
    ],
    ids=["sum_over_shape_rows", "compute_average_loss", "sum_over_size"],
)
def test_hand_written_means_are_accepted_and_exact(loss):
    """A sum divided by the micro-batch's number of rows (or, summed over every axis, by its size) is a mean over
    the rows: refused before although exact."""
    batches, _ = _uneven(steps=3)
    whole, _ = _losses(wide_and_deep, "adagrad", batches, loss=loss)
    for mode in ("embedding", "mlp"):
        micro, _ = _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=3, interleave_from=mode)
        np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0, err_msg=mode)


@pytest.mark.parametrize(
    "loss",
    [
        lambda y, p: tf.reduce_sum(_bce(y, p)) / 37.0,  # the whole batch's size written in the code
        lambda y, p: tf.reduce_sum(_bce(y, p)) / tf.cast(tf.shape(y)[1], tf.float32),  # columns, not rows
        lambda y, p: tf.reduce_sum(tf.square(y - p)) / tf.cast(tf.size(y[:, :1]) * 2, tf.float32),
    ],
    ids=["constant_divisor", "columns_divisor", "twice_the_size"],
)
def test_sums_divided_by_other_counts_are_refused(loss):
    """Each micro-batch's value is a share of a sum there, not a mean over its rows."""
    batches, _ = _uneven(steps=1)
    with pytest.raises(ValueError, match="returns one value for the whole batch"):
        _losses(wide_and_deep, "adagrad", batches, loss=loss, micro_batches=2)


def test_one_row_micro_batches_of_per_row_losses_are_accepted():
    """A micro-batch of one row gives a per-row loss of one element: it was refused as one value for the batch."""
    batches = _batches(steps=2, batch=4)

    def per_row(y, p):
        return tf.square(y - p)[:, 0]

    whole, _ = _losses(wide_and_deep, "adagrad", batches, loss=per_row)
    micro, _ = _losses(wide_and_deep, "adagrad", batches, loss=per_row, micro_batches=4)
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def _with_activity_loss(reduce):
    def build():
        model = wide_and_deep()
        model.add_loss(1e-3 * reduce(tf.square(model.get_layer("hidden_0").output)))
        return model

    return build


def test_an_added_loss_summing_activations_is_refused():
    """Each micro-batch's sum was weighted by its share of the batch: weights 2.3e-2 off, silently (a probe)."""
    batches, _ = _uneven(steps=1)
    with pytest.raises(ValueError, match=r"adds a loss .add_loss. computed from the batch.s data"):
        _losses(_with_activity_loss(tf.reduce_sum), "adagrad", batches, micro_batches=2)


def test_an_added_loss_averaging_activations_is_accepted_and_exact():
    batches, _ = _uneven(steps=3)
    build = _with_activity_loss(tf.reduce_mean)
    whole, _ = _losses(build, "adagrad", batches)
    micro, _ = _losses(build, "adagrad", batches, micro_batches=3, interleave_from="mlp")
    np.testing.assert_allclose(micro, whole, rtol=1e-5, atol=0)


def test_one_loss_object_serving_two_outputs_is_watched_once():
    """It was wrapped twice and unwrapped twice: AttributeError at the second (a regression caught in review)."""

    def build():
        tf.keras.utils.set_random_seed(0)
        ids, dense = _inputs()
        x = tf.keras.layers.Concatenate()(
            [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(n, 4)(ids[f])) for f, n in FIELDS] + [dense]
        )
        outputs = {"a": tf.keras.layers.Dense(1)(x), "b": tf.keras.layers.Dense(1)(x)}
        return tf.keras.Model({**ids, "dense_features": dense}, outputs)

    loss = tf.keras.losses.MeanSquaredError()
    losses = []
    for model in (build(), htf.keras.optimize(build(), micro_batches=2)):
        model.compile("sgd", loss=loss)
        losses.append([model.train_on_batch(x, {"a": y, "b": y}) for x, y in _batches(steps=3)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)

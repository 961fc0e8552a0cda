"""``batch_statistics.mean_over_rows``: which one-value losses are means over a micro-batch's rows, traced with the
micro-batch's size unknown (a dataset's batches) and known (``train_on_batch``'s arrays, a static shape that
TensorFlow writes as constants)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from hybridtf._src.rewrite import batch_statistics


def _bce(y, p):
    return tf.keras.losses.binary_crossentropy(y, p)


def _sum_over_size(y, p):
    squares = tf.square(y - p)
    return tf.reduce_sum(squares) / tf.cast(tf.size(squares), tf.float32)


def _sum_over_columns_count(y, p):
    squares = tf.square(y - p)  # the rows' sums divided by the number of columns: a sum over the rows
    return tf.reduce_sum(tf.reduce_sum(squares, 1)) / tf.cast(tf.shape(squares)[1], tf.float32)


MEANS = {
    "reduce_mean": lambda y, p: tf.reduce_mean(_bce(y, p)),
    "scaled_mean": lambda y, p: 0.5 * tf.reduce_mean(_bce(y, p)),
    "sum_over_shape_rows": lambda y, p: tf.reduce_sum(_bce(y, p)) / tf.cast(tf.shape(y)[0], tf.float32),
    "sum_over_own_rows": lambda y, p: tf.reduce_sum(_bce(y, p)) / tf.cast(tf.shape(_bce(y, p))[0], tf.float32),
    "compute_average_loss": lambda y, p: tf.nn.compute_average_loss(_bce(y, p)),
    "sum_over_size": _sum_over_size,
}
NOT_MEANS = {
    "sum": lambda y, p: tf.reduce_sum(_bce(y, p)),
    "sum_over_constant": lambda y, p: tf.reduce_sum(_bce(y, p)) / 8.0,
    "sum_over_columns": lambda y, p: tf.reduce_sum(_bce(y, p)) / tf.cast(tf.shape(y)[1], tf.float32),
    "row_sums_over_columns": _sum_over_columns_count,
    "mean_of_a_sum": lambda y, p: tf.reduce_mean(tf.reduce_sum(_bce(y, p))),
    "weights_only": lambda y, p: tf.reduce_sum(tf.ones([3])) / 3.0,
}


def _traced(loss, rows):
    found = {}

    @tf.function(input_signature=[tf.TensorSpec([rows, 2]), tf.TensorSpec([rows, 2])])
    def step(y, p):
        value = loss(y, p)
        found["mean"] = batch_statistics.mean_over_rows(value, rows)
        return value

    step.get_concrete_function()
    return found["mean"]


@pytest.mark.parametrize("rows", [None, 8], ids=["unknown_rows", "static_rows"])
@pytest.mark.parametrize("name", sorted(MEANS))
def test_means_over_the_rows_are_recognised(name, rows):
    assert _traced(MEANS[name], rows)


@pytest.mark.parametrize("rows", [None, 8], ids=["unknown_rows", "static_rows"])
@pytest.mark.parametrize("name", sorted(NOT_MEANS))
def test_sums_and_other_divisions_are_not(name, rows):
    assert not _traced(NOT_MEANS[name], rows)

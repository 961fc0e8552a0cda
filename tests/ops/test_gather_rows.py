"""HybridTF>GatherRows vs tf.gather of a resource variable: values, gradient, tape and graph use; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.gather_rows import gather_rows, gather_variable_rows, supports
from hybridtf._src.run.loader import load_ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def gather_cases(draw):
    rows = draw(st.integers(1, 300))
    dim = draw(st.sampled_from([1, 2, 3, 4, 8, 13, 16, 32, 64, 70]))
    n = draw(st.integers(0, 400))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((rows, dim)).astype(dtype)
    indices = rng.integers(0, rows, size=n).astype(index_dtype)
    if draw(st.booleans()):
        indices = np.unique(indices)  # what the packed lookup gathers: ascending distinct rows
    return table, indices


@SETTINGS
@given(gather_cases())
def test_values_equal_tf_gather(case):
    table, indices = case
    var = tf.Variable(table)
    got = gather_rows(var, tf.constant(indices)).numpy()
    np.testing.assert_array_equal(got, tf.gather(var, indices).numpy())
    assert got.dtype == table.dtype and got.shape == (len(indices), table.shape[1])


@SETTINGS
@given(gather_cases())
def test_gradient_equals_tf_gathers(case):
    table, indices = case
    var = tf.Variable(table)
    upstream = tf.constant(np.random.default_rng(1).standard_normal((len(indices), table.shape[1])).astype(table.dtype))
    grads = []
    for fn in (gather_rows, tf.gather):
        with tf.GradientTape() as tape:  # the variable is watched because it is read, as for tf.gather
            loss = tf.reduce_sum(fn(var, tf.constant(indices)) * upstream)
        grads.append(tape.gradient(loss, var))
    ours, ref = grads
    assert isinstance(ours, tf.IndexedSlices)
    np.testing.assert_array_equal(ours.indices.numpy(), ref.indices.numpy())
    np.testing.assert_array_equal(ours.values.numpy(), ref.values.numpy())
    np.testing.assert_array_equal(ours.dense_shape.numpy(), ref.dense_shape.numpy())


def test_gradient_through_a_second_gather_equals_tf_gathers():
    # the upstream gradient is then an IndexedSlices (how the Horovod exchange reads the rows)
    rng = np.random.default_rng(3)
    var = tf.Variable(rng.standard_normal((20, 4)).astype(np.float32))
    unique = tf.constant([2, 5, 7, 11])
    inverse = tf.constant([0, 3, 3, 1, 0, 2])
    grads = []
    for fn in (gather_rows, tf.gather):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(tf.gather(fn(var, unique), inverse)))
        grads.append(tf.convert_to_tensor(tape.gradient(loss, var)).numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_in_tf_function_with_optimizer_matches_tf_gather():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    ids = tf.constant(np.unique(rng.integers(0, 50, size=30)))
    results = []
    for fn in (gather_rows, tf.gather):
        var = tf.Variable(table)
        opt = tf.keras.optimizers.Adagrad(0.1)

        @tf.function
        def step(fn=fn, var=var, opt=opt):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(fn(var, ids)))
            opt.apply_gradients([(tape.gradient(loss, var), var)])
            return fn(var, ids)  # read after the update: ordered after it

        for _ in range(3):
            out = step()
        results.append((out.numpy(), var.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_static_shape_in_graph():
    var = tf.Variable(tf.zeros([10, 6]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def f(ids):
        out = gather_rows(var, ids)
        assert out.shape.as_list() == [None, 6]
        return out

    assert f(tf.constant([1, 2], tf.int64)).shape == (2, 6)


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_out_of_range_index_is_invalid_argument(bad):
    var = tf.Variable(tf.zeros([10, 4]))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"indices\[2\] = -?\d+ is outside the table's rows \[0, 10\)"
    ):
        gather_rows(var, tf.constant([0, 3, bad, 1], tf.int64))


def test_first_bad_position_is_named():
    var = tf.Variable(tf.zeros([5, 1]))
    ids = np.zeros(5000, np.int32)
    ids[3333], ids[4000] = 7, -2
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[3333\] = 7"):
        gather_rows(var, tf.constant(ids))


def test_out_of_range_with_empty_rows_is_invalid_argument():
    var = tf.Variable(tf.zeros([3, 0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the table's rows"):
        gather_rows(var, tf.constant([5]))
    assert gather_rows(var, tf.constant([2])).shape == (1, 0)


def test_bad_arguments_are_value_errors():
    var = tf.Variable(tf.zeros([4, 2]))
    with pytest.raises(ValueError, match="resource variable of rank 2"):
        gather_rows(tf.zeros([4, 2]), [0])
    with pytest.raises(ValueError, match="resource variable of rank 2"):
        gather_rows(tf.Variable(tf.zeros([4])), [0])
    with pytest.raises(ValueError, match="resource variable of rank 2"):
        gather_rows(tf.Variable(tf.zeros([4, 2], tf.int32)), [0])
    with pytest.raises(TypeError, match="int32 or int64"):
        gather_rows(var, tf.constant([0.0]))
    with pytest.raises(ValueError, match="must be a vector"):
        gather_rows(var, tf.constant([[0]]))


def test_kernel_rejects_matrix_indices_and_wrong_dtype():
    var = tf.Variable(tf.zeros([4, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a vector"):
        load_ops().hybrid_tf_gather_rows(var.handle, tf.constant([[0]]), dtype=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"pass dtype=variable\.dtype"):
        load_ops().hybrid_tf_gather_rows(var.handle, tf.constant([0]), dtype=tf.float64)


def test_fallback_for_other_tensors():
    assert not supports(tf.constant([[1.0]]))
    const = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(gather_variable_rows(const, [1]).numpy(), [[3.0, 4.0]])
    var = tf.Variable(const)
    assert supports(var)
    np.testing.assert_array_equal(gather_variable_rows(var, [1, 0]).numpy(), [[3.0, 4.0], [1.0, 2.0]])

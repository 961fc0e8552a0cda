"""Bad input to UniquePartition: every class gives a clear error, never a crash.

Each case goes through the public wrapper (Python checks), the raw op (kernel
checks, eager and inside a tf.function with dynamic shapes) and the pybind11
binding, and the message must name the problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.run.loader import load_ops


def raw(ids, bounds, **attrs):
    return load_ops().hybrid_tf_unique_partition(ids, bounds, **attrs)


def raw_in_graph(ids, bounds, **attrs):
    """The raw op inside a tf.function whose input shapes are unknown."""
    fn = tf.function(
        lambda i, b: raw(i, b, **attrs),
        input_signature=[tf.TensorSpec(None, tf.as_dtype(ids.dtype)), tf.TensorSpec(None, tf.as_dtype(ids.dtype))],
    )
    return fn(ids, bounds)


# --- negative / out-of-range ids where range partitioning needs [0, num_rows) ---------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_negative_ids_with_range(dtype):
    ids = np.array([3, -2, 5], dtype)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[1\] = -2 is negative.*strategy 'mod'"):
        htf.ops.unique_partition(ids, 2, "range", num_rows=10)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"is negative"):
        raw_in_graph(ids, np.array([0, 5, 10], dtype), num_partitions=2, strategy="range")
    with pytest.raises(ValueError, match=r"ids\[1\] = -2 is negative"):
        htf.native.unique_partition(ids, 2, "range", num_rows=10)


def test_ids_beyond_range():
    ids = np.array([3, 10, 5], np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[1\] = 10 is out of range.*\[0, 10\)"):
        htf.ops.unique_partition(ids, 2, "range", num_rows=10)
    with pytest.raises(ValueError, match=r"out of range"):
        htf.native.unique_partition(ids, 2, "range", num_rows=10)


# --- num_partitions outside [1, 4096] --------------------------------------------------------


@pytest.mark.parametrize("p", [0, -3, 4097])
def test_bad_num_partitions(p):
    ids = np.array([1, 2], np.int64)
    with pytest.raises(ValueError, match=r"num_partitions must be in \[1, 4096\]"):
        htf.ops.unique_partition(ids, p)
    with pytest.raises(ValueError, match=r"num_partitions must be in \[1, 4096\]"):
        htf.native.unique_partition(ids, p)
    # The raw op: attr minimum (p < 1) or the kernel's own check (p > 4096).
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"num_partitions"):
        raw(ids, np.zeros([0], np.int64), num_partitions=p)


def test_num_partitions_must_be_int():
    with pytest.raises(TypeError, match="num_partitions must be an int"):
        htf.ops.unique_partition([1, 2], 2.0)
    with pytest.raises(TypeError, match="num_partitions must be an int"):
        htf.ops.unique_partition([1, 2], True)


# --- ids of rank != 1 ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (2, 3), (1, 1, 4)])
def test_ids_of_wrong_rank(shape):
    ids = np.zeros(shape, np.int64)
    with pytest.raises(ValueError, match=r"must be a vector \(rank 1\).*tf.reshape"):
        htf.ops.unique_partition(ids, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids must be a vector \(rank 1\)"):
        raw_in_graph(ids, np.zeros([0], np.int64), num_partitions=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=r"rank"):
        raw(ids, np.zeros([0], np.int64), num_partitions=2)
    with pytest.raises(ValueError, match=r"must be a vector \(rank 1\)"):
        htf.native.unique_partition(ids, 2)


# --- mismatched range bounds -----------------------------------------------------------------

BAD_BOUNDS = [
    ([0, 10], r"needs num_partitions \+ 1 = 3 range_bounds, got 2"),
    ([0, 4, 8, 10], r"needs num_partitions \+ 1 = 3 range_bounds, got 4"),
    ([1, 4, 10], r"range_bounds\[0\] must be 0"),
    ([0, 8, 4], r"non-decreasing.*range_bounds\[1\] = 8 > range_bounds\[2\] = 4"),
]


@pytest.mark.parametrize("bounds,message", BAD_BOUNDS)
def test_mismatched_range_bounds(bounds, message):
    ids = np.array([1, 2, 3], np.int64)
    with pytest.raises(ValueError, match=message):
        htf.ops.unique_partition(ids, 2, "range", range_bounds=bounds)
    with pytest.raises(ValueError, match=message):
        htf.native.unique_partition(ids, 2, "range", range_bounds=bounds)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        raw_in_graph(ids, np.array(bounds, np.int64), num_partitions=2, strategy="range")
    # Dynamic (non-constant) bounds through the wrapper reach the kernel check.
    fn = tf.function(
        lambda b: htf.ops.unique_partition(ids, 2, "range", range_bounds=b).unique_ids,
        input_signature=[tf.TensorSpec([None], tf.int64)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        fn(tf.constant(bounds, tf.int64))


def test_range_needs_exactly_one_of_bounds_or_rows():
    with pytest.raises(ValueError, match="exactly one of num_rows"):
        htf.ops.unique_partition([1], 2, "range")
    with pytest.raises(ValueError, match="exactly one of num_rows"):
        htf.ops.unique_partition([1], 2, "range", num_rows=4, range_bounds=[0, 2, 4])
    with pytest.raises(ValueError, match="only apply to strategy='range'"):
        htf.ops.unique_partition([1], 2, num_rows=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be empty for strategy 'mod'"):
        raw(np.array([1], np.int64), np.array([0, 1, 2], np.int64), num_partitions=2)


def test_unknown_strategy():
    with pytest.raises(ValueError, match="strategy must be one of"):
        htf.ops.unique_partition([1], 2, "hash")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="strategy"):
        raw(np.array([1], np.int64), np.zeros([0], np.int64), num_partitions=2, strategy="hash")


# --- float (and other non-integer) ids -------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_float_or_unsupported_ids(dtype):
    ids = np.array([1, 2, 3], dtype)
    with pytest.raises(TypeError, match=r"ids must be int32 or int64, got"):
        htf.ops.unique_partition(ids, 2)
    with pytest.raises(TypeError, match=r"ids must be an int32 or int64 array"):
        htf.native.unique_partition(ids, 2)
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match=r"not in the list of allowed values"):
        raw(ids, np.zeros([0], dtype), num_partitions=2)


def test_int32_ids_with_bounds_beyond_int32():
    with pytest.raises(ValueError, match="does not fit int32 ids"):
        htf.ops.unique_partition(np.array([1], np.int32), 2, "range", num_rows=2**40)


def test_errors_leave_the_op_usable():
    """A failed call must not poison later calls (no state kept in the kernel)."""
    with pytest.raises(tf.errors.InvalidArgumentError):
        htf.ops.unique_partition(np.array([-1], np.int64), 2, "range", num_rows=4)
    r = htf.ops.unique_partition(np.array([3, 1, 3], np.int64), 2, "range", num_rows=4)
    assert r.unique_ids.numpy().tolist() == [1, 3]

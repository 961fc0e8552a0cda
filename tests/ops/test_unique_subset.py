"""HybridTF>UniqueSubset vs unique_partition of B's packed ids (exact); bad input.

The property: for packed tables A and B whose fields look up the same id
tensors, unique_subset(unique_partition(packed_A, 1, sort_ids=True), ...) is
bit for bit unique_partition(packed_B, 1, sort_ids=True).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.unique_partition import unique_partition
from hybridtf._src.run.unique_subset import OP_NAME, unique_subset

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
ROWS = [1, 2, 7, 40, 1000, 1 << 20]


def _offsets(rows, order, rng, base=0):
    """Packed row offsets of member tables with `rows`, laid out in `order`, with random gaps."""
    offsets = [0] * len(rows)
    at = base
    for m in order:
        at += int(rng.integers(0, 4))
        offsets[m] = at
        at += rows[m]
    return offsets


def _field_ids(rng, rows, size):
    kind = rng.integers(0, 3)
    if kind == 0:
        return rng.integers(0, rows, size=size)
    if kind == 1:  # Zipf-ish: a few hot ids, many repeats
        return np.minimum(rng.zipf(1.3, size=size) - 1, rows - 1)
    return np.full(size, rng.integers(0, rows))  # one repeated id


@st.composite
def subset_cases(draw):
    """A's fields (one member table each), B as A fields (reordered, subset, repeats) in its own row space."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    num_a = draw(st.integers(1, 6))
    rows = [draw(st.sampled_from(ROWS)) for _ in range(num_a)]
    sizes = [draw(st.sampled_from([0, 1, 5, 30, 200])) for _ in range(num_a)]
    ids = [_field_ids(rng, r, s) for r, s in zip(rows, sizes)]
    offsets_a = _offsets(rows, rng.permutation(num_a), rng, base=int(rng.integers(0, 100)))
    kind = draw(st.sampled_from(["permutation", "subset", "repeats"]))
    if kind == "permutation":
        b_fields = rng.permutation(num_a).tolist()
    elif kind == "subset":
        b_fields = rng.permutation(num_a)[: draw(st.integers(1, num_a))].tolist()
    else:
        b_fields = rng.integers(0, num_a, size=draw(st.integers(1, 6))).tolist()
    b_rows = [rows[a] for a in b_fields]
    offsets_b = _offsets(b_rows, rng.permutation(len(b_fields)), rng, base=int(rng.integers(0, 100)))
    id_dtype = draw(st.sampled_from([tf.int32, tf.int64]))
    idx_dtype = draw(st.sampled_from([tf.int32, tf.int64]))
    return ids, offsets_a, b_fields, offsets_b, rows, id_dtype, idx_dtype


def _packed(ids, offsets, dtype):
    parts = [np.asarray(i, np.int64) + o for i, o in zip(ids, offsets)]
    return tf.constant(np.concatenate(parts) if parts else np.zeros([0], np.int64), dtype)


def _check_case(ids, offsets_a, b_fields, offsets_b, rows, id_dtype, idx_dtype):
    a = unique_partition(_packed(ids, offsets_a, id_dtype), 1, out_idx=idx_dtype, sort_ids=True)
    sizes_a = [len(i) for i in ids]
    b_ids = [ids[f] for f in b_fields]
    packed_b = _packed(b_ids, offsets_b, id_dtype)
    direct = unique_partition(packed_b, 1, out_idx=idx_dtype, sort_ids=True)
    derived, sizes_b = unique_subset(
        a,
        tf.constant(sizes_a, tf.int64),
        b_fields,
        [offsets_a[f] for f in b_fields],
        offsets_b,
        [rows[f] for f in b_fields],
    )
    for got, want in zip(derived, direct):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(sizes_b.numpy(), [len(i) for i in b_ids])
    # and against NumPy, so a bug shared with unique_partition cannot hide
    uniq, inverse = np.unique(packed_b.numpy(), return_inverse=True)
    np.testing.assert_array_equal(derived.unique_ids.numpy(), uniq)
    np.testing.assert_array_equal(derived.inverse.numpy(), inverse.reshape(-1))
    assert derived.partition_sizes.numpy().tolist() == [len(uniq)]


@SETTINGS
@given(subset_cases())
def test_equals_unique_partition_of_b(case):
    _check_case(*case)


@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("idx_dtype", [tf.int32, tf.int64])
def test_all_fields_reordered_with_empty_fields(id_dtype, idx_dtype):
    rng = np.random.default_rng(0)
    rows = [100, 5, 3000, 1, 77, 10]
    sizes = [300, 0, 500, 20, 0, 64]
    ids = [_field_ids(rng, r, s) for r, s in zip(rows, sizes)]
    offsets_a = _offsets(rows, range(6), rng)
    b_fields = [4, 2, 0, 5, 1, 3]
    offsets_b = _offsets([rows[f] for f in b_fields], [3, 0, 5, 1, 4, 2], rng, base=1000)
    _check_case(ids, offsets_a, b_fields, offsets_b, rows, id_dtype, idx_dtype)


def test_large_offsets_int64():
    """Offsets beyond int32 with int64 ids."""
    rng = np.random.default_rng(1)
    rows = [1 << 33, 50]
    ids = [rng.integers(0, rows[0], size=400), rng.integers(0, 50, size=100)]
    _check_case(ids, [7, (1 << 33) + 9], [1, 0], [1 << 40, 3], rows, tf.int64, tf.int64)


def test_empty_source():
    a = unique_partition(tf.zeros([0], tf.int64), 1, sort_ids=True)
    b, sizes = unique_subset(a, tf.constant([0, 0], tf.int64), [1, 0], [10, 0], [0, 5], [5, 10])
    assert b.unique_ids.numpy().tolist() == [] and b.inverse.numpy().tolist() == []
    assert b.partition_sizes.numpy().tolist() == [0] and sizes.numpy().tolist() == [0, 0]


def test_dynamic_shapes_and_static_shape_inference():
    ids = [np.array([4, 1, 4, 9]), np.array([2, 2, 0])]
    packed_a = _packed(ids, [0, 10], tf.int64)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.int64)])
    def dynamic(packed, sizes):
        a = unique_partition(tf.reshape(packed, [-1]), 1, sort_ids=True)
        return unique_subset(a, sizes, [1, 0], [10, 0], [0, 3], [3, 10])

    b, sizes_b = dynamic(packed_a, tf.constant([4, 3], tf.int64))
    direct = unique_partition(_packed([ids[1], ids[0]], [0, 3], tf.int64), 1, sort_ids=True)
    for got, want in zip(b, direct):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert sizes_b.numpy().tolist() == [3, 4]

    @tf.function
    def static(packed):
        a = unique_partition(packed, 1, sort_ids=True)
        out, sizes = unique_subset(a, tf.constant([4, 3], tf.int64), [1, 0], [10, 0], [0, 3], [3, 10])
        assert out.unique_ids.shape.as_list() == [None]
        assert out.partition_sizes.shape.as_list() == [1]
        assert out.inverse.shape.as_list() == [None]
        assert sizes.shape.as_list() == [2]
        return out

    static(packed_a)


def test_registered_as_not_differentiable():
    """tf.no_gradient registers None (an op without any registration raises LookupError)."""
    from tensorflow.python.framework import ops as tf_ops

    assert tf_ops.gradient_registry.lookup(OP_NAME) is None


# --- bad input --------------------------------------------------------------------------------


def raw(unique_ids, inverse, field_sizes, **attrs):
    return load_ops().hybrid_tf_unique_subset(unique_ids, inverse, field_sizes, **attrs)


def raw_in_graph(unique_ids, inverse, field_sizes, **attrs):
    """The raw op inside a tf.function whose input shapes are unknown."""
    fn = tf.function(
        lambda u, i, s: raw(u, i, s, **attrs),
        input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(unique_ids).dtype)),
            tf.TensorSpec(None, tf.as_dtype(np.asarray(inverse).dtype)),
            tf.TensorSpec(None, tf.int64),
        ],
    )
    return fn(unique_ids, inverse, field_sizes)


def _both(message, unique_ids, inverse, field_sizes, **attrs):
    """The error eagerly and in a graph with unknown shapes."""
    unique_ids, inverse = np.asarray(unique_ids, np.int64), np.asarray(inverse, np.int32)
    field_sizes = np.asarray(field_sizes, np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        raw(unique_ids, inverse, field_sizes, **attrs)
    # In a graph, a bad attribute already fails in the shape function (ValueError while tracing).
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        raw_in_graph(unique_ids, inverse, field_sizes, **attrs)


ONE = dict(source_fields=[0], source_offsets=[0], target_offsets=[0], num_rows=[10])


@pytest.mark.parametrize("unique_ids", [[0, 5, 3], [1, 1, 2]])
def test_unsorted_unique_ids(unique_ids):
    _both(r"strictly ascending.*unique_ids\[1\].*sort_ids=True", unique_ids, [0, 1, 2], [3], **ONE)


def test_field_sizes_not_summing_to_inverse_length():
    _both(r"field_sizes sum to 2 but inverse has 3 positions", [0, 1, 2], [0, 1, 2], [2], **ONE)
    _both(r"field_sizes sum to more than the 3 positions", [0, 1, 2], [0, 1, 2], [2, 2], **ONE)


def test_negative_field_size():
    _both(r"field_sizes\[0\] = -1 is negative", [0, 1, 2], [0, 1, 2], [-1, 4], **ONE)


@pytest.mark.parametrize("field,message", [(2, r"source_fields\[0\] = 2 is out of range \[0, 2\)"), (-1, "negative")])
def test_source_field_out_of_range(field, message):
    attrs = dict(ONE, source_fields=[field])
    _both(message, [0, 1, 2], [0, 1, 2], [1, 2], **attrs)


def test_overlapping_target_ranges():
    attrs = dict(source_fields=[0, 1, 0], source_offsets=[0, 10, 0], target_offsets=[50, 0, 55], num_rows=[10, 5, 10])
    _both(r"target ranges of fields 0 and 2 overlap: \[50, 60\) and \[55, 65\)", [1, 11], [0, 1], [1, 1], **attrs)
    attrs = dict(source_fields=[0, 1], source_offsets=[0, 10], target_offsets=[0, 9], num_rows=[10, 5])
    _both(r"fields 0 and 1 overlap", [1, 11], [0, 1], [1, 1], **attrs)


def test_inverse_outside_the_fields_segment():
    # A: field 0 -> rows [0, 10), field 1 -> rows [10, 15); B's field reads A field 0 but names
    # field 1's member offset.
    a = unique_partition(tf.constant([3, 3, 7, 12], tf.int64), 1, sort_ids=True)
    message = (
        r"B field 0 \(A field 0\), position 0: inverse\[0\] = 0 is outside \[2, 3\).*"
        r"unique_partition\(packed_ids, num_partitions=1, sort_ids=True\).*field 0 holds ids"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        unique_subset(a, [3, 1], [0], [10], [0], [5])
    # Corrupted inverse values: negative and too large.
    for bad in (-1, 99):
        _both(rf"position 1: inverse\[1\] = {bad} is outside \[0, 2\)", [3, 7], [0, bad], [2], **ONE)


def test_num_rows_too_small_is_caught():
    a = unique_partition(tf.constant([3, 9], tf.int64), 1, sort_ids=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"inverse\[1\] = 1 is outside \[0, 1\)"):
        unique_subset(a, [2], [0], [0], [100], [5])


def test_shared_member_table_is_caught():
    """A fields 0 and 1 share member rows [0, 10): B with field 1 alone would wrongly get field 0's ids."""
    a = unique_partition(tf.constant([1, 2, 2, 5], tf.int64), 1, sort_ids=True)
    message = (
        r"B field 0 takes A's unique ids \[0, 3\) \(those in the member rows \[0, 10\)\) from A field 1, "
        r"but A field 0 also looks up ids there \(its inverse values span \[0, 1\]\).*share a member table"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        unique_subset(a, [2, 2], [1], [0], [0], [10])


def test_shared_member_table_is_rejected_whatever_the_ids():
    """Also when field 1's ids happen to be a subset of field 0's: the rule does not depend on the batch."""
    a = unique_partition(tf.constant([1, 2, 2], tf.int64), 1, sort_ids=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"A fields 0 and 1 share a member table"):
        unique_subset(a, [2, 1], [0], [0], [0], [10])


def test_shared_member_table_that_b_does_not_read_is_fine():
    """A fields 1 and 2 share rows [10, 20); B reads only field 0."""
    ids = [np.array([4, 1, 4]), np.array([3, 5]), np.array([5, 8])]
    a = unique_partition(_packed(ids, [0, 10, 10], tf.int64), 1, sort_ids=True)
    b, _ = unique_subset(a, [3, 2, 2], [0], [0], [7], [10])
    direct = unique_partition(_packed([ids[0]], [7], tf.int64), 1, sort_ids=True)
    for got, want in zip(b, direct):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_num_rows_too_large_is_caught():
    """num_rows reaching into the next member table's rows: their ids are not the field's."""
    a = unique_partition(tf.constant([3, 10 + 1], tf.int64), 1, sort_ids=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"A field 1 also looks up ids there"):
        unique_subset(a, [1, 1], [0], [0], [0], [20])


BAD_ATTRS = [
    (dict(ONE, source_offsets=[0, 0]), r"need one entry per field of B.*lengths 1, 2, 1 and 1"),
    (dict(source_fields=[], source_offsets=[], target_offsets=[], num_rows=[]), r"at least one"),
    (dict(ONE, num_rows=[0]), r"num_rows\[0\] = 0 must be >= 1"),
    (dict(ONE, source_offsets=[-1]), r"must be >= 0"),
    (dict(ONE, target_offsets=[-5]), r"must be >= 0"),
    (dict(ONE, target_offsets=[2**62], num_rows=[2**62]), r"overflows int64"),
]


@pytest.mark.parametrize("attrs,message", BAD_ATTRS)
def test_bad_attrs(attrs, message):
    _both(message, [0, 1], [0, 1], [2], **attrs)


def test_target_rows_beyond_int32_ids():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"do not fit the id dtype.*use int64 ids"):
        raw(
            np.array([0, 1], np.int32),
            np.array([0, 1], np.int32),
            np.array([2], np.int64),
            **dict(ONE, target_offsets=[2**31 - 5]),
        )


@pytest.mark.parametrize("which", [0, 1, 2])
def test_inputs_of_wrong_rank(which):
    inputs = [np.array([0, 1], np.int64), np.array([0, 1], np.int32), np.array([2], np.int64)]
    inputs[which] = inputs[which].reshape(1, -1)
    name = ["unique_ids", "inverse", "field_sizes"][which]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{name} must be a vector \(rank 1\)"):
        raw(*inputs, **ONE)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{name} must be a vector \(rank 1\)"):
        raw_in_graph(*inputs, **ONE)


# --- Python-side argument checks ----------------------------------------------------------------


@pytest.fixture
def source():
    return unique_partition(tf.constant([1, 2], tf.int64), 1, sort_ids=True)


def test_wrapper_mismatched_lengths(source):
    with pytest.raises(ValueError, match=r"one entry per field of B.*source_offsets=2"):
        unique_subset(source, [2], [0], [0, 0], [0], [5])
    with pytest.raises(ValueError, match=r"at least one"):
        unique_subset(source, [2], [], [], [], [])


@pytest.mark.parametrize("bad", [1.5, "a", True, None])
def test_wrapper_non_int(source, bad):
    with pytest.raises(ValueError, match=r"num_rows\[0\] must be an int|num_rows must be a sequence"):
        unique_subset(source, [2], [0], [0], [0], [bad])


def test_wrapper_numpy_ints_accepted(source):
    b, _ = unique_subset(source, np.array([2]), np.array([0]), [np.int64(0)], (np.int32(7),), [5])
    assert b.unique_ids.numpy().tolist() == [8, 9]


def test_wrapper_rejects_more_partitions_and_float_sizes(source):
    two = unique_partition(tf.constant([1, 2], tf.int64), 2, sort_ids=True)
    with pytest.raises(ValueError, match="num_partitions=1"):
        unique_subset(two, [2], [0], [0], [0], [5])
    with pytest.raises(ValueError, match="field_sizes must be integers"):
        unique_subset(source, [2.0], [0], [0], [0], [5])


def test_errors_leave_the_op_usable(source):
    with pytest.raises(tf.errors.InvalidArgumentError):
        unique_subset(source, [3], [0], [0], [0], [5])
    b, _ = unique_subset(source, [2], [0], [0], [0], [5])
    assert b.unique_ids.numpy().tolist() == [1, 2]

"""HybridTF>UniquePartition (TF op, eager and graph) and its pybind11 binding vs the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybridtf as htf
from hybridtf._src.data.synthetic import uniform_ids, zipf_ids
from tests.reference import unique_partition_reference

DTYPES = [np.int32, np.int64]


@st.composite
def cases(draw):
    """Inputs from empty to 10^6 ids, uniform and Zipf, both dtypes, 1..64 partitions, both strategies."""
    n = draw(
        st.one_of(
            st.integers(0, 64),
            st.integers(0, 5_000),
            st.sampled_from([100_000, 1_000_000]),
        )
    )
    dtype = draw(st.sampled_from(DTYPES))
    num_partitions = draw(st.one_of(st.integers(1, 8), st.integers(1, 64)))
    strategy = draw(st.sampled_from(["mod", "range"]))
    dist = draw(st.sampled_from(["uniform", "zipf"]))
    vocab = draw(st.sampled_from([1, 7, 1_000, 100_000, 2_000_000]))
    seed = draw(st.integers(0, 2**31 - 1))
    if dist == "zipf":
        ids = zipf_ids(n, vocab, alpha=draw(st.sampled_from([0.8, 1.1, 1.5])), seed=seed, dtype=dtype)
    elif strategy == "mod":  # mod accepts any id, negative ones too
        lo = -vocab if draw(st.booleans()) else 0
        ids = uniform_ids(n, lo, vocab, seed=seed, dtype=dtype)
    else:
        ids = uniform_ids(n, 0, vocab, seed=seed, dtype=dtype)
    bounds = None
    if strategy == "range":
        if draw(st.booleans()):
            bounds = htf.ops.even_range_bounds(vocab, num_partitions)
        else:  # uneven, possibly empty partitions
            cuts = np.sort(np.random.default_rng(seed).integers(0, vocab + 1, size=num_partitions - 1))
            bounds = np.concatenate([[0], cuts, [vocab]]).astype(np.int64)
    return ids, num_partitions, strategy, bounds


def assert_matches_reference(result, ids, num_partitions, strategy, bounds, sort_ids=False):
    unique, sizes, inverse = (np.asarray(x) for x in result)
    ref_unique, ref_sizes, ref_inverse = unique_partition_reference(ids, num_partitions, strategy, bounds, sort_ids)
    assert unique.dtype == ids.dtype
    np.testing.assert_array_equal(unique, ref_unique)
    np.testing.assert_array_equal(sizes, ref_sizes)
    np.testing.assert_array_equal(inverse, ref_inverse)
    np.testing.assert_array_equal(unique[inverse], ids)


def call_op(ids, num_partitions, strategy, bounds, **kw):
    if strategy == "mod":
        return htf.ops.unique_partition(ids, num_partitions, **kw)
    return htf.ops.unique_partition(ids, num_partitions, "range", range_bounds=bounds, **kw)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(cases())
def test_op_eager_matches_reference(case):
    ids, p, strategy, bounds = case
    assert_matches_reference(call_op(tf.constant(ids), p, strategy, bounds), ids, p, strategy, bounds)


@SETTINGS
@given(cases())
def test_op_graph_matches_reference(case):
    ids, p, strategy, bounds = case
    fn = tf.function(lambda x: tuple(call_op(x, p, strategy, bounds)))
    assert_matches_reference(fn(tf.constant(ids)), ids, p, strategy, bounds)


@SETTINGS
@given(cases())
def test_native_matches_reference(case):
    ids, p, strategy, bounds = case
    if strategy == "mod":
        result = htf.native.unique_partition(ids, p)
    else:
        result = htf.native.unique_partition(ids, p, "range", range_bounds=bounds)
    assert_matches_reference(result, ids, p, strategy, bounds)


@SETTINGS
@given(cases())
def test_sorted_order_matches_reference(case):
    """sort_ids=True: ids ascending inside each partition; op and binding agree."""
    ids, p, strategy, bounds = case
    kw = {"range_bounds": bounds} if strategy == "range" else {}
    op = htf.ops.unique_partition(tf.constant(ids), p, strategy, sort_ids=True, **kw)
    native = htf.native.unique_partition(ids, p, strategy, sort_ids=True, **kw)
    assert_matches_reference(op, ids, p, strategy, bounds, sort_ids=True)
    assert_matches_reference(native, ids, p, strategy, bounds, sort_ids=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["mod", "range"])
def test_million_zipf_ids_op_and_native_agree(dtype, strategy):
    ids = zipf_ids(1_000_000, 5_000_000, alpha=1.1, seed=3, dtype=dtype)
    kw = {"num_rows": 5_000_000} if strategy == "range" else {}
    op = htf.ops.unique_partition(tf.constant(ids), 8, strategy, **kw)
    native = htf.native.unique_partition(ids, 8, strategy, **kw)
    for a, b in zip(op, native):
        np.testing.assert_array_equal(a.numpy(), b)
    bounds = htf.ops.even_range_bounds(5_000_000, 8) if strategy == "range" else None
    assert_matches_reference(native, ids, 8, strategy, bounds)


@pytest.mark.parametrize("out_idx", [tf.int32, tf.int64])
def test_out_idx_dtype(out_idx):
    ids = np.array([4, 1, 4, 9, 1], np.int64)
    r = htf.ops.unique_partition(ids, 3, out_idx=out_idx)
    assert r.inverse.dtype == out_idx
    n = htf.native.unique_partition(ids, 3, out_idx=out_idx.as_numpy_dtype)
    assert n.inverse.dtype == out_idx.as_numpy_dtype
    np.testing.assert_array_equal(r.inverse.numpy(), n.inverse)


def test_documented_example_order():
    r = htf.ops.unique_partition(tf.constant([5, 3, 5, 8, 2]), num_partitions=2)
    assert r.unique_ids.numpy().tolist() == [8, 2, 5, 3]
    assert r.partition_sizes.numpy().tolist() == [2, 2]
    assert r.inverse.numpy().tolist() == [2, 3, 2, 0, 1]


def test_segment_equals_tf_unique_of_the_partition():
    ids = zipf_ids(20_000, 3_000, seed=9)
    r = htf.ops.unique_partition(tf.constant(ids), 5)
    offsets = np.concatenate([[0], np.cumsum(r.partition_sizes.numpy())])
    for p in range(5):
        expected = tf.unique(tf.constant(ids[ids % 5 == p])).y.numpy()
        np.testing.assert_array_equal(r.unique_ids.numpy()[offsets[p] : offsets[p + 1]], expected)


def test_negative_ids_with_mod_use_non_negative_remainder():
    ids = np.array([-1, -4, 3, -1, 0], np.int64)
    r = htf.ops.unique_partition(ids, 3)
    # owners: -1 % 3 = 2, -4 % 3 = 2, 3 % 3 = 0, 0 % 3 = 0; first-occurrence order inside a partition
    assert r.unique_ids.numpy().tolist() == [3, 0, -1, -4]
    assert r.partition_sizes.numpy().tolist() == [2, 0, 2]


def test_empty_ids_and_empty_partitions():
    r = htf.ops.unique_partition(tf.zeros([0], tf.int64), 4)
    assert r.unique_ids.shape == (0,) and r.inverse.shape == (0,)
    assert r.partition_sizes.numpy().tolist() == [0, 0, 0, 0]
    skewed = htf.ops.unique_partition(tf.constant([8, 16, 8, 0], tf.int64), 4)  # every id owned by rank 0
    assert skewed.partition_sizes.numpy().tolist() == [3, 0, 0, 0]


def test_static_shape_inference_and_dynamic_shapes():
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def dynamic(ids):
        r = htf.ops.unique_partition(ids, 6)
        seen["shapes"] = [t.shape.as_list() for t in r]
        return tuple(r)

    out = dynamic(tf.constant([3, 9, 3, 4], tf.int64))
    assert seen["shapes"] == [[None], [6], [None]]
    assert out[1].numpy().tolist() == [0, 0, 0, 2, 1, 0]  # 3, 9 -> partition 3; 4 -> 4

    @tf.function
    def static(ids):
        r = htf.ops.unique_partition(ids, 2)
        seen["static"] = [t.shape.as_list() for t in r]
        return r.unique_ids

    static(tf.constant([1, 2, 3], tf.int32))
    assert seen["static"] == [[None], [2], [3]]


def test_gather_through_inverse_gives_the_same_gradients():
    """Lookup via unique ids + inverse equals a direct gather, values and gradients."""
    ids = tf.constant(zipf_ids(500, 50, seed=2))
    table = tf.Variable(tf.random.stateless_normal([50, 4], seed=[1, 2]))
    with tf.GradientTape(persistent=True) as tape:
        direct = tf.reduce_sum(tf.gather(table, ids) ** 2)
        r = htf.ops.unique_partition(ids, 4)
        fused = tf.reduce_sum(tf.gather(tf.gather(table, r.unique_ids), r.inverse) ** 2)
    np.testing.assert_allclose(direct.numpy(), fused.numpy(), rtol=1e-6)
    g_direct = tf.convert_to_tensor(tape.gradient(direct, table))
    g_fused = tf.convert_to_tensor(tape.gradient(fused, table))
    np.testing.assert_allclose(g_direct.numpy(), g_fused.numpy(), rtol=1e-6)


def test_op_is_registered_not_differentiable():
    ids = tf.constant([1, 2, 1], tf.int64)
    with tf.GradientTape() as tape:
        tape.watch(tf.constant(0.0))
        r = htf.ops.unique_partition(ids, 2)
    assert tape.gradient(tf.cast(r.unique_ids, tf.float32), ids) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("span", ["dense", "sparse"])
@pytest.mark.parametrize("strategy,p", [("mod", 1), ("range", 3)])
def test_sorted_dense_and_hash_paths_agree_with_reference(dtype, span, strategy, p):
    """sort_ids with one partition or range partitions uses a bitmap when the ids span a small range
    (packed tables' row numbers) and the hash table otherwise; both give the reference's outputs."""
    ids = zipf_ids(200_000, 50_000, alpha=1.1, seed=4, dtype=dtype)
    # dense: 50,000 consecutive values; sparse: spread over [0, 10^9), far more than 256 values per id
    ids = ids + 7 if span == "dense" else ids * dtype(20_011)
    limit = int(ids.max()) + 1
    bounds = htf.ops.even_range_bounds(limit, p) if strategy == "range" else None
    kw = {"range_bounds": bounds} if strategy == "range" else {}
    op = htf.ops.unique_partition(tf.constant(ids), p, strategy, sort_ids=True, **kw)
    native = htf.native.unique_partition(ids, p, strategy, sort_ids=True, **kw)
    assert_matches_reference(op, ids, p, strategy, bounds, sort_ids=True)
    assert_matches_reference(native, ids, p, strategy, bounds, sort_ids=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sorted_dense_path_field_major_ids(dtype):
    """Packed ids (field after field, as PackIds gives them): each chunk of positions spans a few
    fields' rows, so the chunks mark private bitmaps that are merged; chunk boundaries fall inside
    fields and field ranges are not word-aligned, so neighbouring chunks share words."""
    rng = np.random.default_rng(7)
    vocab = rng.integers(50, 5_000, size=20)
    offsets = np.concatenate([[0], np.cumsum(vocab)[:-1]])
    ids = np.concatenate(
        [
            off + zipf_ids(20_000, int(v), alpha=1.1, seed=f, dtype=dtype)
            for f, (off, v) in enumerate(zip(offsets, vocab))
        ]
    ).astype(dtype)
    op = htf.ops.unique_partition(tf.constant(ids), 1, "mod", sort_ids=True)
    native = htf.native.unique_partition(ids, 1, "mod", sort_ids=True)
    assert_matches_reference(op, ids, 1, "mod", None, sort_ids=True)
    assert_matches_reference(native, ids, 1, "mod", None, sort_ids=True)


def test_sorted_dense_path_negative_ids_and_bad_range_ids():
    ids = np.array([5, -3, 5, 0, -3, 2], np.int64)  # mod with one partition: negative ids are fine
    assert_matches_reference(htf.ops.unique_partition(ids, 1, sort_ids=True), ids, 1, "mod", None, sort_ids=True)
    bad = np.array([1, 2, 9, 3, -1], np.int64)  # the first bad position is reported, as without sort_ids
    for sort_ids in (False, True):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[2\] = 9 is out of range"):
            htf.ops.unique_partition(bad, 2, "range", num_rows=5, sort_ids=sort_ids)

"""Issue 15's reproducers: every one now gives a clean error naming the argument.

Each case once crashed the process (SIGSEGV / SIGABRT), hung, or returned a
wrong result. The ones that crashed run here in-process: a regression would
kill pytest, which fails the run as loudly as an assertion.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.sparse_apply import sparse_apply_adagrad, sparse_apply_adam
from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat_matmul

M = 2**63 - 1
INVALID = tf.errors.InvalidArgumentError


def _i64(values):
    return tf.constant(values, tf.int64)


@pytest.mark.parametrize(
    "combiners, segments, lengths, inverse, match",
    [
        (["sum"], [3], [M, M, 2], tf.zeros([0], tf.int32), "bag lengths of field 0 .* do not sum to a valid int64"),
        (["mean"], [3], [M, M, 3], tf.constant([0]), "bag lengths of field 0 .* do not sum to a valid int64"),
    ],
)
def test_stitch_combine_wrapping_bag_lengths(combiners, segments, lengths, inverse, match):
    size = int(tf.size(inverse))
    with pytest.raises(INVALID, match=match):
        htf.ops.stitch_combine(
            tf.ones((1, 2)), inverse, [size], combiners, field_segments=segments, segment_lengths=lengths
        )


def test_stitch_combine_wrapping_field_sizes():
    # Three one-hot fields whose sizes wrap around to 1: aborted in a TensorShape CHECK.
    with pytest.raises(INVALID, match=r"field_sizes\[0\] = 9223372036854775807 runs past"):
        htf.ops.stitch_combine(tf.ones((1, 2)), tf.constant([0]), [M, M, 3], ["none"] * 3)


def test_stitch_combine_grad_shape_overflow():
    ops = load_ops()
    with pytest.raises(INVALID, match="d_rows"):
        ops.hybrid_tf_stitch_combine_grad(
            [tf.ones((1, 4))],
            tf.constant([0]),
            _i64([1]),
            _i64([1]),
            _i64([]),
            tf.zeros([0]),
            tf.constant(2**62, tf.int64),
            combiners=["none"],
        )


def _concat_grad(**attrs):
    ops = load_ops()
    args = dict(group_fields=[1], combiners=["none"], piece_groups=[0], piece_items=[0], dims=[2], dense_widths=[])
    args.update(attrs)
    return ops.hybrid_tf_stitch_concat_grad(
        tf.ones((1, 2)), [tf.constant([0])], [_i64([1])], [_i64([1])], [_i64([])], [_i64(1)], num_dense=0, **args
    )


@pytest.mark.parametrize("attrs", [dict(dims=[-1]), dict(dims=[2**62])])
def test_stitch_concat_grad_attributes_validated(attrs):
    with pytest.raises((INVALID, ValueError), match=r"dims\[0\]"):
        _concat_grad(**attrs)


def test_stitch_concat_grad_negative_dense_width():
    ops = load_ops()
    with pytest.raises((INVALID, ValueError), match=r"dense_widths\[0\]"):
        ops.hybrid_tf_stitch_concat_grad(
            tf.ones((1, 2)),
            [tf.constant([0])],
            [_i64([1])],
            [_i64([1])],
            [_i64([])],
            [_i64(1)],
            group_fields=[1],
            combiners=["none"],
            piece_groups=[0, -1],
            piece_items=[0, 0],
            dims=[2],
            dense_widths=[-1],
            num_dense=1,
        )


def _matmul_group(inverse):
    return StitchGroup(tf.ones((2, 3)), tf.constant(inverse, tf.int64), _i64([1]), _i64([1]), _i64([]), ("none",))


def test_stitch_concat_matmul_huge_inverse_forward():
    # Segfaulted (the range check computed max + 1); or returned zeros / row 0.
    with pytest.raises(INVALID, match="inverse index is outside"):
        stitch_concat_matmul([_matmul_group([M])], [], [(0, 0)], tf.ones((3, 2)))


def test_stitch_concat_matmul_huge_inverse_gradient():
    # The gradient corrupted the heap ("double free or corruption") through a GradientTape.
    group = _matmul_group([0])
    kernel = tf.ones((3, 2))
    ops = load_ops()
    with pytest.raises(INVALID, match="inverse index is outside"):
        ops.hybrid_tf_stitch_concat_mat_mul_grad(
            tf.ones((1, 2)),
            kernel,
            [group.rows],
            [_i64([M])],
            [group.field_sizes],
            [group.field_segments],
            [group.segment_lengths],
            [],
            group_fields=[1],
            combiners=["none"],
            piece_groups=[0],
            piece_items=[0],
        )


def _run_with_timeout(fn, seconds=20.0):
    """Runs fn in a daemon thread; fails (instead of hanging pytest) when it does not return."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except Exception as err:
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the op hung (deadlock)"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def test_sparse_apply_aliased_variables_rejected_by_kernel():
    v = tf.Variable(tf.ones((2, 2)))
    ops = load_ops()
    with pytest.raises(INVALID, match="same variable"):
        _run_with_timeout(
            lambda: ops.hybrid_tf_sparse_apply_adagrad(v.handle, v.handle, 0.1, 1e-7, tf.ones((1, 2)), tf.constant([0]))
        )
    m = tf.Variable(tf.zeros((2, 2)))
    with pytest.raises(INVALID, match="same variable"):
        _run_with_timeout(
            lambda: ops.hybrid_tf_sparse_apply_adam(
                v.handle, m.handle, m.handle, 0.1, 0.1, 0.001, 1e-7, tf.ones((1, 2)), tf.constant([0])
            )
        )
    np.testing.assert_array_equal(v.numpy(), np.ones((2, 2)))  # nothing was written


def test_sparse_apply_aliased_variables_rejected_by_wrapper():
    v = tf.Variable(tf.ones((2, 2)))
    with pytest.raises(ValueError, match="same variable as var and accum"):
        sparse_apply_adagrad(v, v, 0.1, 1e-7, tf.ones((1, 2)), tf.constant([0]))
    m = tf.Variable(tf.zeros((2, 2)))
    with pytest.raises(ValueError, match="same variable as m and v"):
        sparse_apply_adam(v, m, m, 0.1, 0.1, 0.001, 1e-7, tf.ones((1, 2)), tf.constant([0]))


def test_sparse_apply_aliased_variables_in_tf_function():
    v = tf.Variable(tf.ones((2, 2)))
    ops = load_ops()

    @tf.function
    def step():
        ops.hybrid_tf_sparse_apply_adagrad(v.handle, v.handle, 0.1, 1e-7, tf.ones((1, 2)), tf.constant([0]))

    with pytest.raises(INVALID, match="same variable"):
        _run_with_timeout(step)


def test_pack_ids_offset_overflow():
    # Returned [-9223372036854775804]: row offset + id wrapped around.
    with pytest.raises(ValueError, match="overflows int64"):
        htf.ops.pack_ids([[5]], [M], [10], ["t"])
    with pytest.raises(INVALID, match="overflows int64"):
        load_ops().hybrid_tf_pack_ids([tf.constant([5])], row_offsets=[M], num_rows=[10], table_names=["t"])


@pytest.mark.parametrize("ids", [np.array([0.0, 2.7]), [0.0, 2.7], np.array([1, 2], np.int16), np.array([True])])
def test_pack_ids_rejects_non_int_numpy_ids(ids):
    # NumPy float ids were truncated ([0.0, 2.7] -> [0, 2]); TF float tensors raised TypeError.
    with pytest.raises(TypeError, match="must be int32 or int64"):
        htf.ops.pack_ids([ids], [0], [10], ["t"])
    with pytest.raises(TypeError, match="must be an int32 or int64 array"):
        htf.native.pack_ids([ids], [0], [10], ["t"])
    with pytest.raises(TypeError, match="must be int32 or int64"):
        htf.ops.pack_ids([tf.constant([0.0, 2.7])], [0], [10], ["t"])


def test_pack_ids_accepts_python_and_numpy_ints():
    for ids in ([1, 2], np.array([1, 2], np.int32), np.array([1, 2]), tf.constant([1, 2]), []):
        packed = htf.ops.pack_ids([ids], [3], [10], ["t"])[0].numpy()
        np.testing.assert_array_equal(packed, np.asarray(ids, np.int64).reshape(-1) + 3)
        native_ids = ids.numpy() if isinstance(ids, tf.Tensor) else ids
        np.testing.assert_array_equal(htf.native.pack_ids([native_ids], [3], [10], ["t"])[0], packed)
    with pytest.raises(TypeError, match="int32 or int64"):  # an empty float array is still a float array
        htf.ops.pack_ids([np.zeros([0], np.float32)], [0], [10], ["t"])


def test_unique_subset_out_of_range_inverse_in_unread_field():
    # A field B does not read held an out-of-range inverse value; the result held an id no position used.
    ops = load_ops()
    unique_ids = tf.constant([1, 12], tf.int64)
    inverse = tf.constant([0, 7], tf.int32)  # field 1 points past the unique ids
    with pytest.raises(INVALID, match=r"inverse\[1\] = 7 is outside \[0, 2\) \(A field 1\)"):
        ops.hybrid_tf_unique_subset(
            unique_ids, inverse, _i64([1, 1]), source_fields=[0], source_offsets=[0], target_offsets=[0], num_rows=[20]
        )
    with pytest.raises(ValueError, match="is outside"):
        htf.native.unique_subset(unique_ids.numpy(), inverse.numpy(), [1, 1], [0], [0], [0], [20])


def test_unique_subset_unused_unique_id():
    # unique id 12 is in B field 0's member rows but no position uses it.
    with pytest.raises(INVALID, match="no position of A field 0 uses it"):
        load_ops().hybrid_tf_unique_subset(
            tf.constant([1, 12], tf.int64),
            tf.constant([0], tf.int32),
            _i64([1]),
            source_fields=[0],
            source_offsets=[0],
            target_offsets=[0],
            num_rows=[20],
        )


def test_native_unique_partition_int64_bounds_not_truncated():
    # Ids [1, 5] (int32), bounds [0, 2**32 + 3, 2**32 + 10] gave sizes [1, 1]; the TF wrapper rejects it.
    ids = np.array([1, 5], np.int32)
    bounds = [0, 2**32 + 3, 2**32 + 10]
    with pytest.raises(ValueError, match="does not fit int32 ids"):
        htf.native.unique_partition(ids, 2, "range", range_bounds=bounds)
    with pytest.raises(ValueError, match="does not fit int32 ids"):
        htf.ops.unique_partition(tf.constant(ids), 2, "range", range_bounds=bounds)
    sizes = htf.native.unique_partition(ids.astype(np.int64), 2, "range", range_bounds=bounds).partition_sizes
    assert sizes.tolist() == [2, 0]


@pytest.mark.parametrize("num_rows", [2**63, 2**64 + 5])
def test_even_range_bounds_rejects_rows_beyond_int64(num_rows):
    with pytest.raises(ValueError, match="must fit int64"):
        htf.ops.even_range_bounds(num_rows, 1)


def test_even_range_bounds_largest_int64():
    assert htf.ops.even_range_bounds(M, 2).tolist() == [0, 2**62, M]


class _UnknownRankIdsModel(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.embedding = tf.keras.layers.Embedding(10, 4)
        self.dense = tf.keras.layers.Dense(1)

    def call(self, ids):
        return self.dense(tf.reshape(self.embedding(ids), [-1, 4]))


def test_keras_ids_of_unknown_rank_train_like_the_plain_model():
    # Rank-1 ids from a dataset without static shapes raised "as_list() is not defined on an unknown
    # TensorShape" in the packed lookup; the lookup now reshapes at run time, like Keras' Embedding.
    def dataset():
        batches = [(np.arange(4) + k, np.ones((4, 1))) for k in range(3)]
        spec = (tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.float64))
        return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)

    losses = []
    for optimize in (False, True):
        tf.keras.utils.set_random_seed(1)
        model = _UnknownRankIdsModel()
        model(np.arange(4))
        model.compile(tf.keras.optimizers.Adagrad(0.1), "mse")
        if optimize:
            model = htf.keras.optimize(model)
        losses.append(model.fit(dataset(), epochs=2, verbose=0).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)

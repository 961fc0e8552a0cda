"""StitchCombine's ``id_shapes``: one-hot outputs in their ids' shape straight from the kernel; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.run.loader import load_ops

ROWS = np.arange(15, dtype=np.float32).reshape(5, 3)
# fields: ids [4, 1] (one-hot), ids [2, 3] (one-hot), a bag field of 2 bags, ids [3] (one-hot, no shape)
INVERSE = np.array([0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 0, 1], np.int64)
SIZES = [4, 6, 2, 3]
COMBINERS = ["none", "none", "sum", "none"]
SEGMENTS = [4, 6, 1, 3]
LENGTHS = [2]


def _fused(rows, id_shapes):
    return htf.ops.stitch_combine(
        rows, INVERSE, SIZES, COMBINERS, field_segments=SEGMENTS, segment_lengths=LENGTHS, id_shapes=id_shapes
    )


def test_outputs_take_their_ids_shape_with_the_same_values():
    plain = _fused(tf.constant(ROWS), None)
    shaped = _fused(tf.constant(ROWS), [[None, 1], [2, 3], None, None])
    assert [o.shape.as_list() for o in shaped] == [[4, 1, 3], [2, 3, 3], [1, 3], [3, 3]]
    for p, s in zip(plain, shaped):
        np.testing.assert_array_equal(tf.reshape(p, tf.shape(s)).numpy(), s.numpy())


def test_static_shapes_in_a_graph_and_an_unknown_batch_resolved_at_run_time():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def step(rows):
        outs = _fused(rows, [[None, 1], [2, None], None, [3]])
        assert [o.shape.as_list() for o in outs] == [[None, 1, 3], [2, None, 3], [None, 3], [3, 3]]
        return [tf.shape(o) for o in outs]

    assert [s.numpy().tolist() for s in step(tf.constant(ROWS))] == [[4, 1, 3], [2, 3, 3], [1, 3], [3, 3]]


def test_gradient_through_shaped_outputs_equals_the_plain_outputs_gradient():
    rows = tf.constant(ROWS)
    probes = [tf.random.stateless_normal([4, 1, 3], [1, 2]), tf.random.stateless_normal([2, 3, 3], [3, 4])]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(rows)
        shaped = _fused(rows, [[4, 1], [2, 3], None, None])
        plain = _fused(rows, None)
        loss_shaped = tf.reduce_sum(shaped[0] * probes[0]) + tf.reduce_sum(shaped[1] * probes[1])
        loss_plain = tf.reduce_sum(plain[0] * tf.reshape(probes[0], [4, 3])) + tf.reduce_sum(
            plain[1] * tf.reshape(probes[1], [6, 3])
        )
    got = tf.convert_to_tensor(tape.gradient(loss_shaped, rows))
    want = tf.convert_to_tensor(tape.gradient(loss_plain, rows))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_python_rejects_bad_id_shapes():
    with pytest.raises(ValueError, match=r"id_shapes has 1 entries but there are 4 combiners"):
        _fused(tf.constant(ROWS), [[4, 1]])
    with pytest.raises(ValueError, match=r"id_shapes\[2\].*one-hot field's ids.*combiner 'sum'"):
        _fused(tf.constant(ROWS), [None, None, [1], None])
    with pytest.raises(ValueError, match=r"id_shapes\[0\].*at most one unknown"):
        _fused(tf.constant(ROWS), [[None, None], None, None, None])


def _raw(id_shapes, combiners=("none",), sizes=(4,)):
    return load_ops().hybrid_tf_stitch_combine(
        tf.constant(ROWS),
        tf.constant(INVERSE[: sum(sizes)]),
        tf.constant(list(sizes), tf.int64),
        tf.constant(list(sizes) if combiners[0] == "none" else [1], tf.int64),
        tf.constant([sum(sizes)] if combiners[0] != "none" else [], tf.int64),
        tf.zeros([0]),
        num_fields=len(combiners),
        combiners=list(combiners),
        id_shapes=id_shapes,
    )


def test_kernel_rejects_bad_id_shapes_with_invalid_argument():
    errors = (tf.errors.InvalidArgumentError, ValueError)
    with pytest.raises(errors, match=r"id_shapes\[0\] holds 6 ids but the field has 4"):
        _raw([[2, 3]])
    with pytest.raises(errors, match=r"id_shapes\[0\] cannot hold the field's 4 ids"):
        _raw([[-1, 3]])
    with pytest.raises(errors, match=r"id_shapes has 2 entries but num_fields is 1"):
        _raw([[4], [4]])
    with pytest.raises(errors, match=r"id_shapes\[0\].*(is a bag|combiner 'sum')"):
        _raw([[1]], combiners=("sum",))
    with pytest.raises(errors, match=r"overflows int64|too large"):  # TF checks the attr itself first
        _raw([[2**40, 2**40, 0]])


def test_grad_op_takes_gradients_in_the_ids_shape_and_checks_their_rows():
    ops = load_ops()
    args = (tf.constant([0, 1, 0, 1]), tf.constant([4], tf.int64), tf.constant([4], tf.int64))
    rest = (tf.zeros([0], tf.int64), tf.zeros([0]), tf.constant(2, tf.int64))
    g = tf.reshape(tf.range(8, dtype=tf.float32), [4, 1, 2])
    d_rows = ops.hybrid_tf_stitch_combine_grad([g], *args, *rest, combiners=["none"])
    np.testing.assert_array_equal(d_rows.numpy(), [[4.0, 6.0], [8.0, 10.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads\[0\] must have shape \[4, dim\]"):
        ops.hybrid_tf_stitch_combine_grad([tf.ones([3, 1, 2])], *args, *rest, combiners=["none"])

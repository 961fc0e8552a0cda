"""Fused updates lock their variables in address order, as TensorFlow's own updates do.

Locked in input order, two updates running at once that take the same two variables in the other
order (``var`` / ``accum`` swapped, or one of TensorFlow's, which locks by address) each held one
lock and waited for the other: the step hung (found by an audit; reproduced within 3,000 steps).
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import sys
import tensorflow as tf
from hybridtf._src.run.sparse_apply import sparse_apply_adagrad

with tf.Graph().as_default():
    a, b = tf.Variable(tf.ones([2000, 16])), tf.Variable(tf.ones([2000, 16]))
    ids, grad = tf.range(2000, dtype=tf.int64), tf.fill([2000, 16], 1e-3)
    ops = [sparse_apply_adagrad(a, b, 0.01, 1e-7, grad, ids), sparse_apply_adagrad(b, a, 0.01, 1e-7, grad, ids)]
    # ResourceSparseApplyAdagrad locks its variables by address: against it too
    ops.append(tf.raw_ops.ResourceSparseApplyAdagrad(var=b.handle, accum=a.handle, lr=0.01, grad=grad, indices=ids))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(int(sys.argv[1])):
            sess.run(ops)
print("done")
"""


def test_updates_of_the_same_variables_in_either_order_run_concurrently_without_deadlock():
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, "15000"], capture_output=True, text=True, env=env, timeout=150, check=False
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError("concurrent fused updates of the same variables deadlocked") from err
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]

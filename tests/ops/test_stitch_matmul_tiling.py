"""StitchConcatMatMul at the edges of its work split vs tf.matmul of StitchConcat, and thread independence.

The forward sums the pieces in cost-balanced chunks and projects each field's distinct rows once;
the gradient runs one task per field (or per set of overlapping fields). These cases put the edges
where a tiled or sliced rewrite of those loops could go wrong: batches that are not a multiple of a
tile, units that are not a multiple of the vector width or a 64-column slice, one field, many
one-hot fields, one-hot fields around bags and dense pieces, and the same result bit for bit
whatever the number of threads.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat, stitch_concat_matmul
from tests.ops.test_stitch_concat_matmul import _kernel, _zipf_group

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def _reference(groups, dense, pieces, kernel):
    return tf.matmul(stitch_concat(groups, dense, pieces), kernel)


def _run(fn, groups, dense, pieces, kernel, absolute=False):
    """fn's output and gradients (rows, dense, kernel) for an upstream gradient sin(i); with
    `absolute`, of |inputs| and |upstream|: the magnitudes that bound each value's rounding error."""
    if absolute:
        groups = [StitchGroup(tf.abs(g.rows), *list(vars(g).values())[1:]) for g in groups]
        dense, kernel = [tf.abs(d) for d in dense], tf.abs(kernel)
    sources = [g.rows for g in groups] + list(dense) + [kernel]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        out = fn(groups, dense, pieces, kernel)
        upstream = tf.reshape(tf.sin(tf.range(tf.size(out), dtype=tf.float32)), tf.shape(out))
        loss = tf.reduce_sum(out * (tf.abs(upstream) if absolute else upstream))
    grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [out.numpy()] + [tf.convert_to_tensor(g).numpy() for g in grads]


def _compare(groups, dense, pieces, kernel):
    """Forward and every gradient of the fused op vs the reference, within 1e-5 of each value's
    magnitude bound (the same sum over absolute values): float rounding only, as both sum in
    different orders, even where a sum cancels to nearly zero."""
    fused = _run(stitch_concat_matmul, groups, dense, pieces, kernel)
    ref = _run(_reference, groups, dense, pieces, kernel)
    bound = _run(_reference, groups, dense, pieces, kernel, absolute=True)
    for f, r, m in zip(fused, ref, bound):
        assert f.shape == r.shape
        excess = np.abs(f - r) - (1e-5 * m + 1e-30)
        assert np.all(excess <= 0), f"off by {np.abs(f - r).max()} (bound {m.max()})"


@st.composite
def sweep_cases(draw):
    """Groups of Zipf fields (mostly one-hot, so projected), optional dense inputs, a placement."""
    batch = draw(st.integers(1, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    groups = []
    for _ in range(draw(st.integers(1, 2))):
        fields = draw(st.integers(1, 4))
        kinds = st.sampled_from(["none", "none", "none", "sum", "mean"])
        combiners = draw(st.lists(kinds, min_size=fields, max_size=fields))
        dim = draw(st.sampled_from([3, 8, 16]))
        groups.append(_zipf_group(rng, batch, fields, draw(st.integers(1, 40)), dim, combiners, draw(st.booleans())))
    widths = draw(st.lists(st.integers(1, 13), max_size=2))
    dense = [tf.constant(rng.standard_normal((batch, w)).astype(np.float32)) for w in widths]
    slots = [(g, f) for g, grp in enumerate(groups) for f in range(len(grp.combiners))]
    pieces = slots + [(-1, m) for m in range(len(dense))]
    order = draw(st.permutations(range(len(pieces))))
    return groups, dense, [pieces[i] for i in order], rng


@SETTINGS
@given(sweep_cases(), st.sampled_from([1, 7, 16, 17, 64, 65, 130, 203]))
def test_sweeps_slices_and_tiles_equal_matmul(case, units):
    groups, dense, pieces, rng = case
    _compare(groups, dense, pieces, _kernel(rng, groups, dense, pieces, units))


def test_more_one_hot_fields_than_one_sweep_takes():
    """70 one-hot fields (more than any field group of 64), 130 rows (three tiles of 64), units 72."""
    rng = np.random.default_rng(7)
    group = _zipf_group(rng, 130, 70, 12, 8, ["none"] * 70)
    pieces = [(0, f) for f in range(70)]
    _compare([group], [], pieces, _kernel(rng, [group], [], pieces, 72))


def test_one_field_one_row():
    rng = np.random.default_rng(8)
    group = _zipf_group(rng, 1, 1, 3, 16, ["none"])
    _compare([group], [], [(0, 0)], _kernel(rng, [group], [], [(0, 0)], 65))


_THREADS_SCRIPT = r"""
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
tf.config.threading.set_inter_op_parallelism_threads(1)
from hybridtf._src.run.stitch_concat import stitch_concat_matmul
from tests.ops.test_stitch_concat_matmul import _kernel, _zipf_group
rng = np.random.default_rng(11)
groups = [_zipf_group(rng, 700, 40, 30, 8, ["none"] * 39 + ["mean"]), _zipf_group(rng, 700, 30, 50, 16, ["none"] * 30)]
dense = [tf.constant(rng.standard_normal((700, 13)).astype(np.float32))]
pieces = [(0, f) for f in range(40)] + [(-1, 0)] + [(1, f) for f in range(30)]
kernel = _kernel(rng, groups, dense, pieces, 256)
sources = [g.rows for g in groups] + dense + [kernel]
with tf.GradientTape() as tape:
    tape.watch(sources)
    out = stitch_concat_matmul(groups, dense, pieces, kernel)
    loss = tf.reduce_sum(out * tf.sin(out))
grads = tape.gradient(loss, sources)
np.save(sys.argv[2], np.concatenate([t.numpy().ravel() for t in [out] + grads]))
"""


def test_result_does_not_depend_on_the_thread_count(tmp_path):
    """One thread and four threads give bit-identical outputs and gradients (several sweeps and tiles)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    results = []
    for threads in (1, 4):
        path = tmp_path / f"t{threads}.npy"
        subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(threads), str(path)], check=True, env=env, cwd=root)
        results.append(np.load(path))
    assert results[0].shape == results[1].shape and results[0].size > 700 * 256
    np.testing.assert_array_equal(results[0], results[1])


def test_kernel_gradient_over_a_large_batch_is_as_accurate_as_matmul():
    """Row-by-row kernel gradients (a dense piece, a pooled field) sum the batch in blocks.

    All-positive inputs and gradients over 8192 rows: one running float32 sum over the batch would
    be off by ~1e-5 of the result (it made a 200-field DeepFM's losses drift 1.7e-5 from the plain
    model's in 11 Adagrad steps); the blocked sums stay as close to the float64 result as
    TensorFlow's matmul gradient.
    """
    rng = np.random.default_rng(11)
    batch, dim, units = 8192, 8, 16
    sizes = tf.constant([batch], tf.int64)
    group = StitchGroup(  # one one-hot field reading rows spread over a range as long as the batch: pooled
        tf.constant(rng.random((batch, dim)).astype(np.float32)),
        tf.constant(rng.integers(0, batch, batch).astype(np.int32)),
        sizes,
        sizes,
        tf.zeros([0], tf.int64),
        ("none",),
    )
    dense = [tf.constant(rng.random((batch, 13)).astype(np.float32))]
    pieces = [(0, 0), (-1, 0)]
    kernel = tf.constant(rng.random((dim + 13, units)).astype(np.float32))
    upstream = tf.constant(rng.random((batch, units)).astype(np.float32))
    x64 = stitch_concat([group], dense, pieces).numpy().astype(np.float64)  # gathered float32 values: exact
    truth = x64.T @ upstream.numpy().astype(np.float64)
    errors = {}
    for name, fn in (("fused", stitch_concat_matmul), ("matmul", _reference)):
        with tf.GradientTape() as tape:
            tape.watch(kernel)
            loss = tf.reduce_sum(fn([group], dense, pieces, kernel) * upstream)
        d_kernel = tape.gradient(loss, kernel).numpy().astype(np.float64)
        errors[name] = float(np.max(np.abs(d_kernel - truth) / truth))
    assert errors["fused"] <= max(4 * errors["matmul"], 1e-6), errors

"""``HybridHashUniqueFields`` (distinct (member, id) pairs of a batch) against a Python reference.

Property cases (hypothesis) for eager, static-shape and dynamic-shape graphs,
fields of any shape, large batches deduplicated in parallel parts, and the
bad-input classes, through the wrapper and the raw op (fuzz-style random bad
members). The packed chain's exactness against unpacked
layers and Keras is ``tests/integration/test_dynamic_packed.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridtf._src.caching.member_unique import unique_member_fields
from hybridtf._src.run.loader import load_ops


def _reference(ids, sizes, members):
    """First-occurrence distinct pairs, inverse and counts, by a Python dict."""
    per_position = np.repeat(np.asarray(members, np.int64), np.asarray(sizes, np.int64))
    index, uids, umembers, counts, inverse = {}, [], [], [], []
    for m, i in zip(per_position.tolist(), np.asarray(ids, np.int64).tolist()):
        k = index.setdefault((m, i), len(uids))
        if k == len(uids):
            uids.append(i)
            umembers.append(m)
            counts.append(0)
        counts[k] += 1
        inverse.append(k)
    return uids, umembers, inverse, counts


_fields = st.lists(
    st.tuples(
        st.integers(0, 6),  # member
        st.lists(st.sampled_from([0, 1, -1, 7, 2**63 - 1, -(2**63), 12345678901]), max_size=12),
    ),
    max_size=6,
)


def _split(fields):
    ids = np.array([i for _, f in fields for i in f], np.int64)
    return ids, [len(f) for _, f in fields], [m for m, _ in fields]


def _check(out, ids, sizes, members):
    want = _reference(ids, sizes, members)
    got = [t.numpy().tolist() for t in out]
    assert got == [list(w) for w in want]
    assert out[2].dtype == tf.int32 and out[0].dtype == tf.int64


def _by_fields(ids, sizes, members):
    """unique_member_fields over ``ids`` cut into fields of ``sizes``."""
    return unique_member_fields(np.split(np.asarray(ids, np.int64), np.cumsum(sizes)[:-1]), members)


@settings(max_examples=15, deadline=None)
@given(_fields.filter(lambda f: len(f) > 0))
def test_matches_reference_in_static_graphs(fields):
    ids, sizes, members = _split(fields)
    static = tf.function(lambda *fs: unique_member_fields(list(fs), tf.constant(members, tf.int64)))
    _check(static(*_field_tensors(fields)), ids, sizes, members)


def test_same_id_in_two_members_is_two_pairs_and_large_batches_agree():
    u, m, inv, c = unique_member_fields([[5, 5], [5, 5]], [3, 1])
    assert u.numpy().tolist() == [5, 5] and m.numpy().tolist() == [3, 1]
    assert inv.numpy().tolist() == [0, 0, 1, 1] and c.numpy().tolist() == [2, 2]
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 3000, size=40)
    members = rng.integers(0, 40, size=40)
    ids = rng.integers(0, 500, size=int(sizes.sum())).astype(np.int64)
    _check(_by_fields(ids, sizes, members), ids, sizes, members)


@pytest.mark.parametrize("layout", ["member_per_field", "shared_runs", "first_and_last_shared"])
def test_large_batches_split_into_parts_agree(layout):
    """>= 16384 ids are cut between fields into parts sharing no member and deduplicated in parallel."""
    rng = np.random.default_rng(1)
    fields = 120
    members = np.arange(fields)
    if layout == "shared_runs":  # a member's fields next to each other, and one shared far apart
        members = np.repeat(np.arange(fields // 3), 3)
        members[10], members[90] = 77, 77
    elif layout == "first_and_last_shared":  # no cut possible: one part
        members[-1] = members[0]
    sizes = rng.integers(0, 900, size=fields)
    ids = rng.zipf(1.3, size=int(sizes.sum())).astype(np.int64)
    assert ids.size >= 2 * 16384
    _check(_by_fields(ids, sizes, members), ids, sizes, members)


def test_empty_batches():
    u, m, inv, c = unique_member_fields([tf.zeros([0], tf.int64)], [0])
    assert [t.shape.as_list() for t in (u, m, inv, c)] == [[0], [0], [0], [0]]
    u, _, inv, _ = unique_member_fields([tf.zeros([0], tf.int64), tf.zeros([0, 1], tf.int64)], [1, 2])
    assert u.shape[0] == 0 and inv.shape[0] == 0


def test_random_bad_members_are_errors_never_crashes():
    rng = np.random.default_rng(7)
    spec = tf.TensorSpec([None], tf.int64)
    raw = tf.function(
        lambda a, b, m: load_ops().hybrid_tf_hybrid_hash_unique_fields([a, b], m), input_signature=[spec] * 3
    )
    for _ in range(60):
        sizes = rng.integers(0, 8, size=2)
        members = rng.choice([-(2**63), -1, 0, 3, 2**20 - 1, 2**20, 2**63 - 1], size=int(rng.integers(1, 4)))
        ids = rng.integers(-5, 5, size=int(sizes.sum()))
        a, b = np.split(ids, [int(sizes[0])])
        valid = members.size == 2 and ((members >= 0) & (members < 2**20)).all()
        args = [tf.constant(v, tf.int64) for v in (a, b, members)]
        if valid:
            _check(raw(*args), ids, sizes, members)
        else:
            with pytest.raises(tf.errors.InvalidArgumentError, match="HybridHash unique"):
                raw(*args)


def _field_tensors(fields, rng=None):
    """Each field's ids as its own tensor, in a shape a lookup would give ([n], [n, 1] or [2, n / 2])."""
    out = []
    for k, (_, f) in enumerate(fields):
        a = np.asarray(f, np.int64)
        if k % 3 == 1:
            a = a.reshape(-1, 1)
        elif k % 3 == 2 and a.size % 2 == 0:
            a = a.reshape(2, -1)
        out.append(tf.constant(a))
    return out


@settings(max_examples=40, deadline=None)
@given(_fields.filter(lambda f: len(f) > 0))
def test_matches_reference_eager_and_in_dynamic_graphs(fields):
    ids, sizes, members = _split(fields)
    _check(unique_member_fields(_field_tensors(fields), members), ids, sizes, members)
    spec_free = tf.function(lambda *fs: unique_member_fields(list(fs), tf.constant(members, tf.int64)))
    dynamic = [tf.TensorSpec(None, tf.int64) for _ in fields]
    _check(spec_free.get_concrete_function(*dynamic)(*_field_tensors(fields)), ids, sizes, members)


def test_fields_op_large_batches_and_static_inverse_shape():
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 1500, size=60)
    members = rng.integers(0, 30, size=60)
    ids = rng.zipf(1.2, size=int(sizes.sum())).astype(np.int64)
    assert ids.size >= 2 * 16384  # parallel parts
    fields = np.split(ids, np.cumsum(sizes)[:-1])
    _check(unique_member_fields(fields, members), ids, sizes, members)
    graph = tf.function(lambda *fs: unique_member_fields(list(fs), [0, 1])).get_concrete_function(
        tf.TensorSpec([4, 1], tf.int64), tf.TensorSpec([3], tf.int64)
    )
    assert graph.structured_outputs[2].shape.as_list() == [7]


def test_fields_op_bad_inputs_name_the_problem_and_the_fix():
    ops = load_ops()
    with pytest.raises(ValueError, match="2 fields but 3 field_members"):
        unique_member_fields([[1], [2]], [0, 0, 0])
    with pytest.raises(ValueError, match="at least one field"):
        unique_member_fields([], [])
    with pytest.raises(TypeError, match="field 1's ids must be integers"):
        unique_member_fields([[1], [1.5]], [0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"field_members\[1\] = -1 is not a member"):
        unique_member_fields([[1], [2]], [0, -1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="is not a member"):
        unique_member_fields([[1]], [2**20])
    with pytest.raises(ValueError, match="must be a vector"):
        unique_member_fields([[1]], [[0]])
    spec = tf.TensorSpec([None], tf.int64)
    raw = tf.function(lambda a, m: ops.hybrid_tf_hybrid_hash_unique_fields([a, a], m), input_signature=[spec, spec])
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 fields of ids but field_members has shape"):
        raw(tf.constant([1], tf.int64), tf.constant([0, 0, 0], tf.int64))

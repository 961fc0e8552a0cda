"""hybridtf.native (the pybind11 bindings of the TF-free layer) vs the NumPy references; bad input.

No TensorFlow in this file: tools/sanitize.sh runs it against the ASan/UBSan build of the module.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hybridtf import native
from tests.fuzz import references as ref

M = 2**63 - 1


def test_no_tensorflow_needed():
    assert "tensorflow" not in sys.modules or "hybridtf._src.run.loader" in sys.modules


@pytest.mark.parametrize("seed", range(20))
def test_stitch_combine_matches_reference(seed):
    rng = np.random.default_rng(seed)
    dtype = (np.float32, np.float64)[seed % 2]
    rows = rng.standard_normal((7, 3)).astype(dtype)
    combiners = ["none", "sum", "mean", "sqrtn"][: 1 + seed % 4]
    sizes, segments, lengths = [], [], []
    for c in combiners:
        if c == "none":
            sizes.append(int(rng.integers(0, 5)))
            segments.append(sizes[-1])
        else:
            bag = [int(x) for x in rng.integers(0, 4, int(rng.integers(0, 4)))]
            sizes.append(sum(bag))
            segments.append(len(bag))
            lengths += bag
    inverse = rng.integers(0, 7, sum(sizes)).astype((np.int32, np.int64)[seed % 3 == 0])
    weights = None if seed % 2 else rng.uniform(0.5, 2, sum(sizes)).astype(dtype)
    got = native.stitch_combine(
        rows, inverse, sizes, combiners, field_segments=segments, segment_lengths=lengths, weights=weights
    )
    want = ref.combine_reference(rows, inverse, sizes, segments, lengths, weights, combiners)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    grads = [rng.standard_normal(g.shape).astype(dtype) for g in got]
    d_rows = native.stitch_combine_grad(
        grads, inverse, sizes, combiners, 7, field_segments=segments, segment_lengths=lengths, weights=weights
    )
    want = ref.combine_grad_reference(grads, inverse, sizes, segments, lengths, weights, combiners, 7)
    np.testing.assert_allclose(d_rows, want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(field_sizes=[1], combiners=["sum"], field_segments=[3], segment_lengths=[M, M, 3]), "bag lengths"),
        (dict(field_sizes=[M, M, 3], combiners=["none"] * 3), "runs past"),
        (dict(field_sizes=[1], combiners=["max"]), "combiner must be one of"),
        (dict(field_sizes=[2], combiners=["none"]), "field_sizes"),
    ],
)
def test_stitch_combine_bad_layout(kwargs, match):
    with pytest.raises(ValueError, match=match):
        native.stitch_combine(np.ones((2, 2), np.float32), np.array([0]), **kwargs)


@pytest.mark.parametrize("value", [M, -1, 2])
def test_stitch_combine_bad_inverse(value):
    with pytest.raises(ValueError, match="out of range"):
        native.stitch_combine(np.ones((2, 2), np.float32), np.array([value]), [1], ["none"])


def test_stitch_combine_dtypes():
    with pytest.raises(TypeError, match="float32 or float64"):
        native.stitch_combine(np.ones((2, 2), np.int64), np.array([0]), [1], ["none"])
    with pytest.raises(TypeError, match="int32 or int64"):
        native.stitch_combine(np.ones((2, 2), np.float32), np.array([0.0]), [1], ["none"])
    with pytest.raises(TypeError, match="integers"):
        native.stitch_combine(np.ones((2, 2), np.float32), np.array([0]), [1.5], ["none"])


def test_stitch_combine_grad_shape_overflow():
    with pytest.raises(ValueError, match="d_rows"):
        native.stitch_combine_grad([np.ones((1, 4), np.float32)], np.array([0]), [1], ["none"], 2**62)


def test_pack_ids_matches_reference_and_checks():
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 5, (3, 2)).astype(np.int32), rng.integers(0, 9, 4)]
    got = native.pack_ids(ids, [0, 5], [5, 9], ["a", "b"])
    for g, w in zip(got, ref.pack_ids_reference(ids, [0, 5], [5, 9], "error")):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(ValueError, match="overflows int64"):
        native.pack_ids([[5]], [M], [10], ["t"])
    with pytest.raises(ValueError, match="outside its vocabulary"):
        native.pack_ids([[10]], [0], [10], ["t"])
    counted = native.pack_ids([np.array([3, -1, 99])], [4], [10], ["t"], on_invalid="count")
    assert counted[0].tolist() == [7, 4, 4] and counted[2].tolist() == [2]
    with pytest.raises(TypeError, match="int32 or int64"):
        native.pack_ids([np.array([0.0, 2.7])], [0], [10], ["t"])
    with pytest.raises(TypeError):
        native.pack_ids([[1]], [0.5], [10], ["t"])


def test_unique_subset_matches_reference_and_checks():
    a_ids = np.array([3, 1, 12, 14, 12, 20])  # A fields: [3, 1] (rows [0, 10)), [12, 14, 12] ([10, 15)), [20]
    sizes = [2, 3, 1]
    unique_ids, inverse = np.unique(a_ids, return_inverse=True)
    got = native.unique_subset(unique_ids, inverse.astype(np.int32), sizes, [1, 0], [10, 0], [0, 5], [5, 10])
    want = ref.unique_subset_reference(a_ids, sizes, [1, 0], [10, 0], [0, 5])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    bad = inverse.copy()
    bad[-1] = 99  # a field B does not read
    with pytest.raises(ValueError, match="is outside"):
        native.unique_subset(unique_ids, bad, sizes, [1, 0], [10, 0], [0, 5], [5, 10])
    with pytest.raises(ValueError, match="overflows int64"):
        native.unique_subset(unique_ids, inverse, sizes, [0], [M], [0], [10])


def test_unique_partition_int32_bounds_not_truncated():
    with pytest.raises(ValueError, match="does not fit int32 ids"):
        native.unique_partition(np.array([1, 5], np.int32), 2, "range", range_bounds=[0, 2**32 + 3, 2**32 + 10])
    r = native.unique_partition(np.array([M, -M - 1, 0, M]), 3)
    want = ref.unique_partition_reference(np.array([M, -M - 1, 0, M]), 3)
    for g, w in zip(r, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    "seed,hot_rows,capacity,members", [(0, 40, 0, 1), (1, 40, 0, 1), (2, 1000, 0, 1), (3, 40, 2400, 1), (4, 40, 0, 3)]
)
def test_hybrid_hash_touched_only_flushes_select_the_same_top_k_as_a_full_pass(seed, hot_rows, capacity, members):
    """With count_decay 1 and no TTL a flush compares only the tier's rows and the records touched since
    the last flush (no untouched cold row can outrank the tier). On a large table with a small tier it
    reads far fewer records than the table holds, and it keeps exactly the top-k that a full pass keeps
    (here: the same stream through a store with a never-expiring TTL, which passes over every record: in two
    passes for the small tier, in one for the large), evictions (a capacity) and a packed store (one id in
    several members: ties broken by member) included. Here, not in test_hybrid_hash.py: tools/sanitize.sh
    runs this file under ASan/UBSan."""
    rng = np.random.default_rng(seed)
    ids = np.unique(
        np.concatenate([rng.integers(-(2**63), 2**63 - 1, 2500 // members, dtype=np.int64), np.arange(-300, 300)])
    ).astype(np.int64)
    keys_id = np.tile(ids, members)  # every id in every member
    keys_member = np.repeat(np.arange(members, dtype=np.int64), len(ids))
    kw = dict(dim=4, hot_rows=hot_rows, warmup_steps=0, flush_every=10**6, capacity=capacity, members=members)
    touched_only = native.HybridHashStore("touched", **kw)
    full = native.HybridHashStore("full", ttl_steps=10**9, **kw)
    packed = members > 1

    def step(pick, add):
        batch, member = keys_id[pick], keys_member[pick] if packed else None
        for s in (touched_only, full):
            s.lookup(batch, add, members=member)
            grad = np.tile((batch % 7).astype(np.float32)[:, None] * 0.01, (1, 4))
            s.apply_adagrad(batch, grad, 0.1, members=member)
            s.end_step()  # step 0 flushes (flush_every 10**6), the others do not

    def check_top_k(what):
        stored = touched_only.export()
        rows = zip(stored[3].tolist(), stored[0].tolist(), touched_only.export_members().tolist())
        expected = {(i, m) for _, i, m in sorted((-c, i, m) for c, i, m in rows)[:hot_rows]}
        for s in (touched_only, full):
            hot_id, hot_member = s.hot_keys()
            assert set(zip(hot_id.tolist(), hot_member.tolist())) == expected, what
        for a, b in zip(stored, full.export()):
            np.testing.assert_array_equal(a, b)

    # The same first counts for an id in every member: the k-th splits an id's members (ties by member).
    first = np.tile(rng.integers(0, 4, len(ids)), members)
    for chunk in np.array_split(np.arange(len(keys_id)), 6):  # a capacity evicts only rows not used in this step
        step(chunk, first[chunk])
    for s in (touched_only, full):
        s.flush()
    check_top_k("first flush")
    for round_ in range(10):
        pick = rng.choice(len(keys_id), 90, replace=False)
        if round_ % 3 == 0:  # ties at the k-th count, broken by id (and member)
            add = rng.choice([1, 2, 3], size=len(pick))
        elif round_ % 3 == 1:  # counts past the histogram's last bucket
            add = rng.integers(4095, 10**5, len(pick))
        else:
            add = rng.integers(0, 50, len(pick))
        step(pick, add)
        before = touched_only.export()
        for s in (touched_only, full):
            s.flush()
        after = touched_only.export()
        for a, b in zip(before, after):  # a flush never changes a value
            np.testing.assert_array_equal(a, b)
        if hot_rows == 40:  # a small tier: the touched-only path (a large one passes over the arena)
            assert touched_only.last_flush_candidates() <= hot_rows + len(pick)
        assert full.last_flush_candidates() == len(after[0])
        if capacity:
            assert len(after[0]) <= capacity
            assert touched_only.stats()["evictions"] > 0
        check_top_k(round_)


def test_hybrid_hash_packed_store_bad_members():
    """A packed store's binding: a member outside the store, or a members array unlike ids, is a clear error."""
    with pytest.raises(ValueError, match="members must be in"):
        native.HybridHashStore("p", dim=2, hot_rows=2, members=0)
    s = native.HybridHashStore("p", dim=2, hot_rows=2, members=2)
    ids = np.array([1, 2], np.int64)
    with pytest.raises(ValueError, match="member"):
        s.lookup(ids, members=np.array([0, 2], np.int64))
    with pytest.raises(ValueError, match="like ids"):
        s.lookup(ids, members=np.array([0], np.int64))
    rows = s.lookup(ids, members=np.array([0, 1], np.int64))
    assert rows.shape == (2, 2) and not np.array_equal(rows[0], rows[1])  # member 1 has its own seed
    np.testing.assert_array_equal(s.lookup(ids[1:], members=np.array([1], np.int64), insert=False), rows[1:])

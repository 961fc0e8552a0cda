"""HybridHash store and ops: deterministic rows, Algorithm 1, eviction, Adam, concurrency, bad input.

The TF ops and the NumPy binding (``hybridtf.native.HybridHashStore``) run the
same TF-free store; each test checks a property against a NumPy reference.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import hybridtf as htf
from hybridtf import native
from hybridtf._src.caching.table import HybridHashTable, TableConfig
from tests.racing import run_racing


def _table(name="t", **kw):
    kw.setdefault("dim", 4)
    kw.setdefault("hot_rows", 4)
    return HybridHashTable(TableConfig(name, **kw))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40, unique=True), st.integers(1, 5))
def test_initial_rows_depend_only_on_seed_and_id(ids, batches):
    ids = np.array(ids, np.int64)
    a = _table(seed=7)
    rows_a = a.lookup(tf.constant(ids)).numpy()
    b = _table(seed=7)
    for part in np.array_split(ids[::-1], batches):  # other order, other batches
        b.lookup(tf.constant(part))
    exported = b.export()
    order = np.argsort(ids)
    np.testing.assert_array_equal(exported[0].numpy(), ids[order])
    np.testing.assert_array_equal(exported[1].numpy(), rows_a[order])
    np.testing.assert_array_equal(rows_a, native.hybrid_hash_initial_rows(ids, 4, 7))
    assert np.all(np.abs(rows_a) <= 0.05)
    assert not np.array_equal(rows_a, native.hybrid_hash_initial_rows(ids, 4, 8))


def test_initializers_have_their_distributions():
    ids = np.arange(20000, dtype=np.int64)
    normal = native.hybrid_hash_initial_rows(ids, 8, 1, "normal", 0.5, 2.0)
    assert abs(normal.mean() - 0.5) < 0.03 and abs(normal.std() - 2.0) < 0.03
    uniform = native.hybrid_hash_initial_rows(ids, 8, 1, "uniform", -1.0, 3.0)
    assert uniform.min() >= -1 and uniform.max() < 3 and abs(uniform.mean() - 1.0) < 0.03
    assert np.all(native.hybrid_hash_initial_rows(ids[:5], 3, 1, "constant", 0.25) == 0.25)
    assert np.all(native.hybrid_hash_initial_rows(ids[:5], 3, 1, "zeros") == 0)


def test_algorithm1_warmup_then_top_k_flushes():
    s = native.HybridHashStore("alg1", dim=2, hot_rows=2, warmup_steps=2, flush_every=2)
    counts = {10: 5, 20: 1, 30: 3, 40: 2}
    for _ in range(3):  # steps 0, 1: warm-up; the end of step 2 flushes (2 >= 2, 2 % 2 == 0)
        ids = np.array(list(counts), np.int64)
        s.lookup(ids, np.array(list(counts.values())))
        assert s.stats()["hits"] == 0
        s.end_step()
    st_ = s.stats()
    assert st_["flushes"] == 1 and st_["hot_used"] == 2
    s.lookup(np.array([10, 30, 20], np.int64))  # top-2 by count: 10 and 30
    st_ = s.stats()
    assert st_["hits"] == 2 and st_["lookups"] == 15
    s.end_step()  # step 3: no flush (3 % 2 != 0)
    assert s.stats()["flushes"] == 1
    for _ in range(20):  # 20 becomes the most frequent
        s.lookup(np.array([20], np.int64), np.array([10]))
    s.end_step()  # step 4 flushes
    before = s.stats()["hits"]
    s.lookup(np.array([20, 10, 30], np.int64))
    assert s.stats()["hits"] - before == 2  # 20 and 10 (count 16 > 30's 10)


def test_flush_never_changes_a_value_and_everything_fits_hot():
    s = native.HybridHashStore("f", dim=3, hot_rows=3, warmup_steps=0, flush_every=1)
    rng = np.random.default_rng(0)
    for step in range(12):
        ids = np.unique(rng.integers(0, 8, 5)).astype(np.int64)
        s.lookup(ids)
        s.apply_adagrad(ids, rng.normal(size=(len(ids), 3)).astype(np.float32), 0.1)  # ends the step
        if step % 3 == 0:
            before = s.export()
            s.flush()
            after = s.export()
            for a, b in zip(before[:5], after[:5]):
                np.testing.assert_array_equal(a, b)
    big = native.HybridHashStore("g", dim=3, hot_rows=100, warmup_steps=0, flush_every=1)
    big.lookup(np.arange(10, dtype=np.int64))
    big.end_step()
    big.lookup(np.arange(20, dtype=np.int64))  # new ids go to free hot entries
    assert big.stats()["hot_used"] == big.stats()["size"] == 20


def _hot_set(store, ids):
    """The ids of ``ids`` that are hot, found by looking each up once (every count + 1: the order is kept)."""
    hot = set()
    for i in ids:
        before = store.stats()["hits"]
        store.lookup(np.array([i], np.int64))
        if store.stats()["hits"] > before:
            hot.add(int(i))
    return hot


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flushes_keep_exactly_the_top_k_by_count_then_id(seed):
    """The incremental flush (rows that stay hot stay put) and its selection (a count histogram, then a
    radix selection of the tied ids) give the top-k of Algorithm 1, ties by smaller id, flush after flush."""
    rng = np.random.default_rng(seed)
    hot_rows = 40
    ids = np.unique(
        np.concatenate(
            [
                rng.integers(-(2**63), 2**63 - 1, 60, dtype=np.int64),  # every digit of the radix selection
                rng.integers(-50, 50, 40),  # small ids: equal high digits
                np.array([-(2**63), 2**63 - 1, -1, 0], np.int64),
            ]
        )
    ).astype(np.int64)
    s = native.HybridHashStore("top", dim=3, hot_rows=hot_rows, warmup_steps=0, flush_every=10**6)
    counts = {int(i): 0 for i in ids}
    for round_ in range(6):
        if round_ % 3 == 0:
            add = rng.integers(0, 3, len(ids))
        elif round_ % 3 == 1:  # few distinct counts: many ties at the k-th
            add = rng.choice([1, 2, 3, 5000], size=len(ids), p=[0.5, 0.3, 0.15, 0.05])
        else:  # counts past the histogram's last bucket, where the k-th may then fall
            add = rng.integers(4095, 10**6, len(ids))
        s.lookup(ids, add)
        for i, c in zip(ids, add):
            counts[int(i)] += int(c)
        before = s.export()
        s.flush()
        after = s.export()
        for a, b in zip(before[:3], after[:3]):  # ids, rows, slots: a flush never changes a value
            np.testing.assert_array_equal(a, b)
        assert s.stats()["hot_used"] == hot_rows
        expected = {i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:hot_rows]}
        assert _hot_set(s, ids) == expected, round_
        for i in ids:
            counts[int(i)] += 1


@pytest.mark.parametrize("hot_rows", [6, 100])  # the top-k flush (decay in its pass) / everything fits
def test_count_decay_after_each_flush_follows_algorithm1(hot_rows):
    rng = np.random.default_rng(5)
    ids = rng.permutation(np.arange(-15, 15, dtype=np.int64))
    s = native.HybridHashStore("decay", dim=2, hot_rows=hot_rows, warmup_steps=1, flush_every=2, count_decay=0.5)
    counts = dict.fromkeys(ids.tolist(), 0)
    for step in range(8):
        add = rng.integers(0, 20, len(ids))
        s.lookup(ids, add)
        for i, c in zip(ids.tolist(), add.tolist()):
            counts[i] += c
        flushes = step >= 1 and step % 2 == 0
        if flushes:
            expected_hot = {i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:hot_rows]}
        s.end_step()
        if flushes:  # counts halve (truncated) after the flush's selection
            counts = {i: int(np.float32(c) * np.float32(0.5)) for i, c in counts.items()}
        exported = s.export()
        assert dict(zip(exported[0].tolist(), exported[3].tolist())) == counts, step
        if flushes:
            assert _hot_set(s, ids) == expected_hot
            counts = {i: c + 1 for i, c in counts.items()}


def _np_adam(rows, m, v, touched, g, alpha, c1, c2, eps):
    m[:] = m + (-m) * c1
    v[:] = v + (-v) * c2
    m[touched] = m[touched] + g * c1
    v[touched] = v[touched] + (g * g) * c2
    rows[:] = rows - (m * alpha) / (np.sqrt(v) + eps)


def test_adam_decays_every_stored_row_like_keras():
    s = native.HybridHashStore("adam", dim=3, hot_rows=2, warmup_steps=1, flush_every=2, seed=3)
    ids = np.arange(6, dtype=np.int64)
    rows = s.lookup(ids).copy()
    m = np.zeros_like(rows)
    v = np.zeros_like(rows)
    rng = np.random.default_rng(1)
    for _ in range(6):
        touched = np.sort(rng.choice(6, 3, replace=False))
        s.lookup(ids[touched])
        g = rng.normal(size=(3, 3)).astype(np.float32)
        args = (np.float32(0.01), np.float32(0.1), np.float32(0.001), np.float32(1e-7))
        s.apply_adam(ids[touched], g, *args)
        s.end_step()
        _np_adam(rows, m, v, touched, g, *args)
    out = s.export()
    np.testing.assert_allclose(out[1], rows, rtol=1e-6)
    np.testing.assert_allclose(out[2][:, 0], m, rtol=1e-6)
    np.testing.assert_allclose(out[2][:, 1], v, rtol=1e-6)


def test_capacity_evicts_least_frequent_and_counts_it():
    s = native.HybridHashStore("cap", dim=2, hot_rows=2, capacity=64, warmup_steps=100)
    s.lookup(np.array([1, 2], np.int64), np.array([1000, 1000]))
    s.end_step()
    for step in range(10):
        s.lookup(np.arange(100 + 20 * step, 120 + 20 * step, dtype=np.int64))
        s.end_step()
    st_ = s.stats()
    assert st_["size"] <= 64
    assert st_["evictions"] == st_["inserts"] - st_["size"] > 0
    kept = set(s.export()[0].tolist())
    assert {1, 2} <= kept  # the frequent ids survive
    with pytest.raises(ValueError, match=r"'tiny' is full.*Raise capacity"):
        tiny = native.HybridHashStore("tiny", dim=2, hot_rows=1, capacity=3)
        tiny.lookup(np.arange(5, dtype=np.int64))


def test_concurrent_lookups_updates_and_flushes_lose_nothing():
    dim, n_ids, threads, rounds = 8, 200, 4, 200
    table = _table("stress", dim=dim, hot_rows=50, warmup_steps=0, flush_every=1, initializer="zeros")
    table.lookup(tf.range(n_ids, dtype=tf.int64))
    errors = []
    stop = threading.Event()

    def updater(k):  # thread k owns ids k, k + threads, ...: +1 per element per round
        ids = tf.range(k, n_ids, threads, dtype=tf.int64)
        grad = -tf.ones([len(ids), dim])
        for _ in range(rounds):
            table.apply_sgd(ids, grad, tf.constant(1.0), end_step=False)

    def reader():
        while not stop.is_set():
            rows = table.lookup(tf.range(n_ids, dtype=tf.int64), insert=True).numpy()
            if not np.all(rows == rows[:, :1]):
                errors.append("torn row")

    def flusher():
        while not stop.is_set():
            table.flush()
            table.end_step()

    background = [threading.Thread(target=reader) for _ in range(2)] + [threading.Thread(target=flusher)]
    workers = [threading.Thread(target=updater, args=(k,)) for k in range(threads)]
    run_racing(background, workers, stop)
    assert not errors
    ids, rows = table.export()[:2]
    assert len(ids) == n_ids
    np.testing.assert_array_equal(rows.numpy(), np.full((n_ids, dim), rounds, np.float32))
    assert table.stats()["flushes"] > 0


def test_bad_config_and_ids():
    with pytest.raises(ValueError, match=r"'x'.*hot_rows"):
        native.HybridHashStore("x", dim=2, hot_rows=0)
    with pytest.raises(ValueError, match=r"'x'.*capacity"):
        native.HybridHashStore("x", dim=2, hot_rows=1, capacity=-2)
    with pytest.raises(TypeError, match="integer"):
        native.HybridHashStore("x", dim=2, hot_rows=1).lookup(np.array([0.5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'raw'.*hot_rows"):
        from hybridtf._src.run.loader import load_ops

        load_ops().hybrid_tf_hybrid_hash_table(table_name="raw", dim=2, hot_rows=0)
    with pytest.raises(ValueError, match=r"'x': warmup_steps must be in \[0, 4294967295\]"):
        native.HybridHashStore("x", dim=2, hot_rows=1, warmup_steps=2**32)
    with pytest.raises(ValueError, match=r"'x': flush_every must be in \[1, 4294967295\]"):
        native.HybridHashStore("x", dim=2, hot_rows=1, flush_every=2**33)
    with pytest.raises(ValueError, match=r"'layer': hot_rows must be a positive int, got 0\. Pass the number"):
        htf.layers.DynamicEmbedding(4, hot_rows=0, name="layer")
    t = _table("ids")
    with pytest.raises(TypeError, match=r"'ids'.*int64"):
        t.lookup(tf.constant([1.0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'ids'.*repeated"):
        t.lookup(tf.constant([1, 2], tf.int64))
        t.apply_sgd(tf.constant([1, 1], tf.int64), tf.ones([2, 4]), 0.1)


def test_bad_initializers_shared_names_export_dims_and_import_members():
    from hybridtf._src.run.loader import load_ops

    ops = load_ops()
    with pytest.raises(ValueError, match=r"'full': hot_rows \(10\) must be smaller than capacity \(4\)"):
        TableConfig("full", dim=2, hot_rows=10, capacity=4)
    with pytest.raises(ValueError, match=r"'full': hot_rows \(8\) must be smaller than capacity \(8\)"):
        htf.layers.DynamicEmbedding(2, hot_rows=8, capacity=8, name="full")
    # the default hot tier fits a capacity: a tenth of it
    assert htf.layers.DynamicEmbedding(2, capacity=50, name="bounded")._table_config.hot_rows == 5
    assert htf.layers.DynamicEmbedding(2, name="unbounded")._table_config.hot_rows == 100_000
    for a, b in ((0.0, float("inf")), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match=r"'nf'.*parameters must be finite"):
            TableConfig("nf", dim=2, hot_rows=1, initializer="normal", init_a=a, init_b=b)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"'raw_nf'.*parameters must be finite"):
            ops.hybrid_tf_hybrid_hash_table(table_name="raw_nf", dim=2, hot_rows=1, init_a=a, init_b=b)
    ops.hybrid_tf_hybrid_hash_table(table_name="s", dim=4, hot_rows=4, shared_name="one_store")
    ops.hybrid_tf_hybrid_hash_table(table_name="s", dim=4, hot_rows=4, shared_name="one_store")  # the same: fine
    for other in (dict(hot_rows=9), dict(capacity=2), dict(initializer="zeros"), dict(seed=3)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"'one_store'.*another {next(iter(other))}"):
            ops.hybrid_tf_hybrid_hash_table(table_name="s", dim=4, shared_name="one_store", **{"hot_rows": 4, **other})
    t = _table("exported")
    t.lookup(tf.constant([1, 2], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'exported' has dim 4 but the export asks for dim 7"):
        ops.hybrid_tf_hybrid_hash_export(t.resource_handle, dim=7)
    empty = tf.zeros([0], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="member must be -1"):
        ops.hybrid_tf_hybrid_hash_import(
            t.resource_handle,
            empty,
            tf.zeros([0, 4]),
            tf.zeros([0, 0, 4]),
            empty,
            tf.zeros([0]),
            tf.constant(0, tf.int64),
            empty,
            member=-7,
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"step must be a scalar"):
        t.import_(empty, tf.zeros([0, 4]), tf.zeros([0, 0, 4]), empty, tf.zeros([0]), tf.constant([0], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows \[1,4\] must be a matrix of one row per id"):
        two = tf.constant([1, 2], tf.int64)
        t.import_(two, tf.zeros([1, 4]), tf.zeros([2, 0, 4]), two, tf.zeros([0]), tf.constant(0, tf.int64))
    np.testing.assert_array_equal(np.sort(t.export()[0].numpy()), [1, 2])  # refused imports changed nothing


@pytest.mark.parametrize("steps, hot_after_restore", [(3, 0), (4, 2)])
def test_a_restore_fills_the_hot_tier_only_if_the_saved_store_had_flushed(steps, hot_after_restore):
    """warmup_steps=2, flush_every=3: the first flush ends step 3, so a store saved after 3 steps has
    nothing hot, and its restore must not make rows hot (hit statistics would differ from the saved run's)."""
    saved = _table("r", dim=2, hot_rows=2, warmup_steps=2, flush_every=3)
    for _ in range(steps):
        saved.lookup(tf.constant([1, 2, 3], tf.int64))
        saved.end_step()
    assert saved.stats()["hot_used"] == hot_after_restore
    restored = _table("r", dim=2, hot_rows=2, warmup_steps=2, flush_every=3)
    restored.import_(*saved.export())
    assert restored.stats()["hot_used"] == hot_after_restore


def test_decay_adam_moments_alone_on_every_stored_row():
    """The end-of-data step's data-free part of Keras Adam: m += -m * c1, v += -v * c2; rows and counts stay."""
    c1, c2 = np.float32(0.1), np.float32(0.001)
    empty = _table("no_slots")  # no Adam update yet: zero moments, nothing to do
    empty.lookup(tf.constant([3, 4], tf.int64))
    empty.decay_adam_moments(c1, c2)
    t = _table("decay", hot_rows=2)
    ids = tf.constant([7, -(2**63), 2**63 - 1], tf.int64)
    t.lookup(ids)
    t.apply_adam(ids, tf.constant(np.random.default_rng(0).normal(size=(3, 4)), tf.float32), 0.01, c1, c2, 1e-7)
    t.flush()  # two rows hot, one cold: both tiers decay
    before = [x.numpy() for x in t.export()[:4]]
    t.decay_adam_moments(c1, c2)
    after = [x.numpy() for x in t.export()[:4]]
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])  # rows
    np.testing.assert_array_equal(after[3], before[3])  # counts
    m, v = before[2][:, 0], before[2][:, 1]
    assert np.all(m != 0)
    np.testing.assert_array_equal(after[2][:, 0], m + (-m) * c1)
    np.testing.assert_array_equal(after[2][:, 1], v + (-v) * c2)
    adagrad = _table("adagrad")
    adagrad.lookup(tf.constant([1], tf.int64))
    adagrad.apply_adagrad(tf.constant([1], tf.int64), tf.ones([1, 4]), 0.1, 1e-7)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'adagrad'.*needs 2 optimizer slot"):
        adagrad.decay_adam_moments(c1, c2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a scalar"):
        t.decay_adam_moments(tf.constant([c1, c1]), c2)

"""HybridHash record hints: ``lookup_records`` + the ``*Records`` updates (the packed chain's pair).

The update takes each row's record (and hot entry) from the lookup instead of probing the hash
map; a hint is used only when it names a live record with the expected (member, id) key, or,
without reading any header, when the update's (ids, members, hints) are exactly the last
training lookup's and no row moved since (the proven fast path). Each test runs the same steps
with and without hints (stale, flushed, wrong or garbage hints, ids in another order) and
requires bit-identical tables, plus bad input (repeated ids through the fast path) and
concurrency stresses (with flushes; and the fast path alone, beside inserts and reads).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from hybridtf._src.caching.table import HybridHashTable, MemberInit, TableConfig
from tests.racing import run_racing


def _packed(name, first="uniform", **kw):
    kw.setdefault("dim", 4)
    kw.setdefault("hot_rows", 3)
    members = (MemberInit("a", 1, first, -0.05, 0.05), MemberInit("b", 2, "normal", 0.0, 0.1))
    return HybridHashTable(TableConfig(name, members=members, **kw))


def _update(table, kind, ids, grad, members, records):
    if kind == "sgd":
        table.apply_sgd(ids, grad, tf.constant(0.1), members=members, records=records)
    elif kind == "adagrad":
        table.apply_adagrad(ids, grad, tf.constant(0.1), tf.constant(1e-7), members=members, records=records)
    else:
        args = (ids, grad, tf.constant(0.01), tf.constant(0.1), tf.constant(0.001), tf.constant(1e-7))
        table.apply_adam(*args, lazy=kind == "lazy_adam", members=members, records=records)


def _export(table):
    return [t.numpy() for t in table.export_with_members()]


def _hints(kind_of_hint, records, rng):
    if kind_of_hint == "exact":
        return records
    if kind_of_hint == "shuffled":  # valid records of other keys: every one must be refused
        return tf.constant(rng.permutation(records.numpy()))
    if kind_of_hint == "garbage":
        return tf.constant(rng.choice([-1, -(2**63), 2**62, 2**32 + 1, 7], size=len(records)).astype(np.int64))
    return tf.zeros([0], tf.int64)  # empty: probe every id


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "lazy_adam"])
def test_hints_never_change_a_result(kind):
    rng = np.random.default_rng(0)
    plain = _packed(f"plain_{kind}", flush_every=1, hot_rows=20)  # a third of the ids hot: both tiers in a batch
    hinted = _packed(f"hinted_{kind}", flush_every=1, hot_rows=20)
    for step, hint in enumerate(["exact", "shuffled", "garbage", "empty", "exact", "stale", "flushed", "exact"]):
        ids = tf.constant(rng.choice(60, size=25, replace=False).astype(np.int64))
        members = tf.constant(rng.integers(0, 2, size=25).astype(np.int64))
        rows_p = plain.lookup(ids, members=members).numpy()
        rows_h, records = hinted.lookup_records(ids, members=members)
        np.testing.assert_array_equal(rows_h.numpy(), rows_p)
        assert records.shape == ids.shape and records.dtype == tf.int64
        if hint == "stale":  # the store is re-imported between lookup and update: the records move
            ids_e, rows_e, slots_e, counts_e, slot_init, step_e, members_e = hinted.export_with_members()
            order = tf.range(tf.shape(ids_e)[0] - 1, -1, -1)  # another insertion order
            per_row = [tf.gather(t, order) for t in (ids_e, rows_e, slots_e, counts_e, members_e)]
            hinted.import_(*per_row[:4], slot_init, step_e, members=per_row[4])
            fresh = hinted.lookup_records(ids, members=members)[1].numpy()
            plain.lookup(ids, members=members)  # the same counts in both
            assert not np.array_equal(fresh, records.numpy())
        if hint == "flushed":  # the hot set is re-selected between lookup and update: rows move tiers
            plain.flush()
            hinted.flush()
        grad = tf.constant(rng.normal(size=(25, 4)).astype(np.float32))
        _update(plain, kind, ids, grad, members, None)
        _update(hinted, kind, ids, grad, members, _hints(hint, records, rng))
        for a, b in zip(_export(plain), _export(hinted)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}, {hint} hints")
    assert hinted.stats()["flushes"] == plain.stats()["flushes"] > 0


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_lookup_hints_with_ids_in_another_order(kind):
    """The lookup's own hints with its ids permuted: not the lookup's batch, so every hint is checked."""
    rng = np.random.default_rng(1)
    plain, hinted = _packed(f"order_p_{kind}", flush_every=2), _packed(f"order_h_{kind}", flush_every=2)
    for _ in range(4):
        ids = tf.constant(rng.choice(40, size=16, replace=False).astype(np.int64))
        members = tf.constant(rng.integers(0, 2, size=16).astype(np.int64))
        plain.lookup(ids, members=members)
        _, records = hinted.lookup_records(ids, members=members)
        perm = rng.permutation(16)
        ids_p, members_p = tf.gather(ids, perm), tf.gather(members, perm)
        grad = tf.constant(rng.normal(size=(16, 4)).astype(np.float32))
        _update(plain, kind, ids_p, grad, members_p, None)
        _update(hinted, kind, ids_p, grad, members_p, records)
        for a, b in zip(_export(plain), _export(hinted)):
            np.testing.assert_array_equal(a, b)


def test_repeated_ids_of_the_lookup_itself_are_refused():
    """The update's arrays are exactly the lookup's (the fast path), and an id repeats: refused, nothing changed."""
    t = _packed("repeat_fast")
    ids, members = tf.constant([7, 8, 7], tf.int64), tf.constant([0, 1, 0], tf.int64)
    _, records = t.lookup_records(ids, members=members)
    before = _export(t)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[2\] = 7 \(member 0\) is repeated"):
        t.apply_sgd(ids, tf.ones([3, 4]), tf.constant(0.1), members=members, records=records)
    for a, b in zip(before, _export(t)):
        np.testing.assert_array_equal(a, b)


def test_bad_records_and_ids_with_hints():
    t = _packed("bad_hints")
    ids = tf.constant([3, 4], tf.int64)
    members = tf.constant([0, 1], tf.int64)
    _, records = t.lookup_records(ids, members=members)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'bad_hints'.*records must be empty or one per id"):
        t.apply_sgd(ids, tf.ones([2, 4]), tf.constant(0.1), members=members, records=records[:1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="records must be"):
        t.apply_sgd(ids, tf.ones([2, 4]), tf.constant(0.1), members=members, records=tf.reshape(records, [2, 1]))
    # a hint naming another row's record never lets an absent or repeated id through
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[1\] = 5 \(member 1\) is not in the table"):
        t.apply_sgd(tf.constant([3, 5], tf.int64), tf.ones([2, 4]), tf.constant(0.1), members=members, records=records)
    with pytest.raises(tf.errors.InvalidArgumentError, match="repeated"):
        t.apply_sgd(
            tf.constant([3, 3], tf.int64),
            tf.ones([2, 4]),
            tf.constant(0.1),
            members=tf.constant([0, 0], tf.int64),
            records=tf.stack([records[0], records[0]]),
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"members\[1\] = 2"):
        t.lookup_records(ids, members=tf.constant([0, 2], tf.int64))
    empty_rows, empty_records = t.lookup_records(tf.zeros([0], tf.int64))
    assert empty_rows.shape == (0, 4) and empty_records.shape == (0,)


def test_concurrent_hinted_updates_inserts_and_flushes_lose_nothing():
    dim, n_ids, threads, rounds = 8, 200, 3, 400
    table = _packed("stress_hints", first="zeros", dim=dim, hot_rows=40, flush_every=1)
    members = tf.zeros([n_ids], tf.int64)
    table.lookup(tf.range(n_ids, dtype=tf.int64), members=members)
    stop = threading.Event()
    errors = []

    def updater(k):  # thread k owns ids k, k + threads, ...: +1 per element per round
        ids = tf.range(k, n_ids, threads, dtype=tf.int64)
        mem = tf.zeros_like(ids)
        _, records = table.lookup_records(ids, members=mem)
        wrong = tf.reverse(records, [0])  # mostly other rows' records: refused, probed
        grad = -tf.ones([len(ids), dim])
        for r in range(rounds):
            table.apply_sgd(ids, grad, tf.constant(1.0), end_step=False, members=mem, records=(records, wrong)[r % 2])

    def inserter():  # new ids of member 1: the exclusive insert pass (and map growth) between updates
        base = 1000
        while not stop.is_set():
            table.lookup(tf.range(base, base + 50, dtype=tf.int64), members=tf.ones([50], tf.int64))
            base += 50

    def flusher():
        while not stop.is_set():
            table.flush()
            table.end_step()

    def reader():
        while not stop.is_set():
            rows = table.lookup(tf.range(n_ids, dtype=tf.int64), insert=False, members=members).numpy()
            if not np.all(rows == rows[:, :1]):
                errors.append("torn row")

    background = [threading.Thread(target=f) for f in (inserter, flusher, reader)]
    workers = [threading.Thread(target=updater, args=(k,)) for k in range(threads)]
    run_racing(background, workers, stop)
    assert not errors
    ids, rows, _, _, _, _, mem = table.export_with_members()
    first = mem.numpy() == 0
    np.testing.assert_array_equal(ids.numpy()[first], np.arange(n_ids))
    np.testing.assert_array_equal(rows.numpy()[first], np.full((n_ids, dim), rounds, np.float32))
    assert table.stats()["flushes"] > 0 and table.stats()["size"] > n_ids


def test_concurrent_proven_hint_updates_with_inserts_and_reads():
    """The fast path under concurrency: threads update the last lookup's exact batch (no header read)
    while another inserts new ids (exclusive sections, map growth) and a reader copies rows."""
    dim, n_ids, threads, rounds = 8, 300, 3, 150
    table = _packed("stress_proven", first="zeros", dim=dim, hot_rows=100, flush_every=1)
    ids = tf.range(n_ids, dtype=tf.int64)
    members = tf.zeros([n_ids], tf.int64)
    table.lookup(ids, members=members)
    table.flush()  # some rows hot, some cold: both kinds of hints
    _, records = table.lookup_records(ids, members=members)
    stop = threading.Event()
    errors = []
    grad = -tf.ones([n_ids, dim])

    def updater():  # +1 per element per round, every thread on every row
        for _ in range(rounds):
            table.apply_sgd(ids, grad, tf.constant(1.0), end_step=False, members=members, records=records)

    def inserter():  # plain lookups of new ids of member 1 (they keep no batch)
        base = 1000
        while not stop.is_set():
            table.lookup(tf.range(base, base + 50, dtype=tf.int64), members=tf.ones([50], tf.int64))
            base += 50

    def reader():
        while not stop.is_set():
            rows = table.lookup(ids, insert=False, members=members).numpy()
            if not np.all(rows == rows[:, :1]):
                errors.append("torn row")

    background = [threading.Thread(target=f) for f in (inserter, reader)]
    workers = [threading.Thread(target=updater) for _ in range(threads)]
    run_racing(background, workers, stop)
    assert not errors
    got_ids, rows, _, _, _, _, mem = table.export_with_members()
    first = mem.numpy() == 0
    np.testing.assert_array_equal(got_ids.numpy()[first], np.arange(n_ids))
    np.testing.assert_array_equal(rows.numpy()[first], np.full((n_ids, dim), threads * rounds, np.float32))
    assert table.stats()["size"] > n_ids


def test_the_kept_hinted_batch_is_counted_in_the_stats_bytes():
    """A training lookup with hints keeps (ids, members, hints) for the update: 24 bytes per id, in ``bytes``."""
    ids = tf.constant(np.arange(5000, dtype=np.int64) * 7919)
    members = tf.constant(np.arange(5000, dtype=np.int64) % 2)
    plain, hinted = _packed("plain_bytes", hot_rows=8), _packed("hinted_bytes", hot_rows=8)
    plain.lookup(ids, members=members)
    hinted.lookup_records(ids, members=members)
    extra = hinted.stats()["bytes"] - plain.stats()["bytes"]
    assert 3 * 8 * 5000 <= extra < 2 * 3 * 8 * 5000, extra


@pytest.mark.parametrize("why", ["slots", "capacity"])
def test_a_refused_member_import_keeps_the_members_rows(why):
    """Checks before the member's rows are removed: a restore it refuses leaves the store as it was."""
    table = _packed(f"refused_{why}", capacity=3 if why == "capacity" else 0, hot_rows=2)
    ids, members = tf.constant([1, 2, 3], tf.int64), tf.constant([0, 0, 1], tf.int64)
    table.lookup(ids, members=members)
    table.apply_adagrad(ids, tf.ones([3, 4]), tf.constant(0.1), tf.constant(1e-7), members=members)
    before = [t.numpy() for t in table.export_with_members()]
    n = 1 if why == "slots" else 3  # the other member's row + 3 > capacity 3
    args = (tf.constant([1, 2, 4][:n], tf.int64), tf.zeros([n, 4]), tf.zeros([n, 2 if why == "slots" else 1, 4]))
    args += (tf.zeros([n], tf.int64), tf.zeros([2 if why == "slots" else 1]), tf.constant(1, tf.int64))
    match = "2 optimizer slot" if why == "slots" else "needs 4 rows, more than capacity 3"
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        table.import_(*args, members=tf.zeros([n], tf.int64), member=0)
    for b, a in zip(before, table.export_with_members()):
        np.testing.assert_array_equal(a.numpy(), b)

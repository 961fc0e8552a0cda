"""HybridHash parallel find-or-insert: large batches take the parallel paths of ``Store::Lookup``.

A training lookup of ``n * dim >= 65536`` floats runs on TensorFlow's thread pool: the initial
rows of missing ids are computed outside any lock and the inserts run in parts by home map slot
(``InsertParallel``); a store with a capacity inserts one by one (``InsertSerial``). The tests
run the same steps through both and require identical outputs, tables and statistics, the same
table under 1 and 2 intra-op threads, and concurrent inserting lookups, updates and flushes that
lose nothing and return only complete rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from hybridtf import native
from hybridtf._src.caching.table import HybridHashTable, MemberInit, TableConfig
from tests.racing import run_racing

DIM = 8
N = 12_000  # positions per lookup: N * DIM >= 65536, so the kernels shard over the thread pool
_MEMBERS = (MemberInit("a", 11, "uniform", -0.05, 0.05), MemberInit("b", 12, "normal", 0.0, 0.1))
_STATS = ("size", "hot_used", "inserts", "lookups", "hits", "occurrences", "occurrence_hits", "step", "flushes")


def _table(name, capacity, hot_rows):
    return HybridHashTable(
        TableConfig(
            name, dim=DIM, hot_rows=hot_rows, capacity=capacity, warmup_steps=2, flush_every=2, members=_MEMBERS
        )
    )


def _steps(seed, steps=5):
    """Per step: ids with repeats (old ids, new ids, raw 64-bit values) and their members."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(-(2**63), 2**63 - 1, size=40_000, dtype=np.int64)
    pool[:100] = np.arange(100)  # small ids next to huge ones
    for s in range(steps):
        picks = rng.integers(0, 8_000 * (s + 1), size=N)  # each step reaches new ids
        yield pool[picks], rng.integers(0, 2, size=N).astype(np.int64)


def _run(table, seed, out):
    """Training lookups with repeats, then the packed chain's pair (lookup_records + hinted Adagrad)."""
    rng = np.random.default_rng(seed + 1)
    for ids, members in _steps(seed):
        out.append(table.lookup(ids, members=members).numpy())
        keys, counts = np.unique(np.stack([members, ids], 1), axis=0, return_counts=True)
        keys = keys[rng.permutation(len(keys))]
        rows, records = table.lookup_records(keys[:, 1], counts=counts, members=keys[:, 0])
        out.append(rows.numpy())
        grad = tf.constant(rng.normal(size=(len(keys), DIM)).astype(np.float32))
        table.apply_adagrad(keys[:, 1], grad, tf.constant(0.1), tf.constant(1e-7), members=keys[:, 0], records=records)
    return [t.numpy() for t in table.export_with_members()]


@pytest.mark.parametrize("hot_rows", [1_500, 1_000_000], ids=["topk", "everything_fits"])
def test_parallel_inserts_equal_one_by_one(hot_rows):
    outs = {}
    exports = {}
    stats = {}
    for kind, capacity in (("parallel", 0), ("one_by_one", 10**9)):
        table = _table(f"par_{kind}", capacity, hot_rows)
        outs[kind] = []
        exports[kind] = _run(table, 7, outs[kind])
        stats[kind] = {k: table.stats()[k] for k in _STATS}
    assert len(outs["parallel"]) == len(outs["one_by_one"]) == 10
    for a, b in zip(outs["parallel"], outs["one_by_one"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(exports["parallel"], exports["one_by_one"]):
        np.testing.assert_array_equal(a, b)
    assert stats["parallel"] == stats["one_by_one"]
    assert stats["parallel"]["size"] > 20_000 and stats["parallel"]["flushes"] >= 2
    if hot_rows > stats["parallel"]["size"]:
        assert stats["parallel"]["hot_used"] == stats["parallel"]["size"]  # new rows took free hot entries


_THREADS_SCRIPT = """
import hashlib, sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
from tests.ops.test_hybrid_hash_parallel import _run, _table
out = []
exported = _run(_table("threads", 0, 1_500), 3, out)
h = hashlib.sha256()
for a in out + exported:
    h.update(a.tobytes())
print("DIGEST", h.hexdigest())
"""


def test_tables_do_not_depend_on_intra_op_threads():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3")
    digests = []
    for threads in (1, 2):
        run = subprocess.run(
            [sys.executable, "-c", _THREADS_SCRIPT, str(threads), str(root)],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        digests.append([line for line in run.stdout.splitlines() if line.startswith("DIGEST")])
    assert digests[0] and digests[0] == digests[1]


def test_concurrent_parallel_inserts_updates_and_flushes_lose_nothing():
    """Member 0: updated rows (zeros + 1 per round, never torn); member 1: inserted by racing lookups."""
    members = (MemberInit("upd", 1, "zeros", 0.0, 0.0), MemberInit("new", 5, "uniform", -0.05, 0.05))
    table = HybridHashTable(
        TableConfig("par_stress", dim=DIM, hot_rows=3_000, warmup_steps=0, flush_every=1, members=members)
    )
    n_upd, rounds, updaters = 600, 60, 3
    upd_ids = np.arange(n_upd, dtype=np.int64)
    table.lookup(upd_ids, members=np.zeros(n_upd, np.int64))
    reference = native.HybridHashStore("ref", DIM, 10, seed=5, initializer="uniform")
    errors, seen = [], []
    stop = threading.Event()

    def updater(k):  # thread k owns update ids k, k + updaters, ...: +1 per element per round
        ids = upd_ids[k::updaters]
        grad = -tf.ones([len(ids), DIM])
        for _ in range(rounds):
            table.apply_sgd(ids, grad, tf.constant(1.0), end_step=False, members=tf.zeros([len(ids)], tf.int64))

    def inserter(k):  # overlapping new-id ranges with repeats: the same new ids race between threads
        rng = np.random.default_rng(k)
        for _ in range(4):
            ids = 10**15 + rng.integers(0, 30_000, size=N).astype(np.int64)
            rows = table.lookup(ids, members=np.ones(N, np.int64)).numpy()
            if not np.array_equal(rows, reference.lookup(ids, insert=False)):
                errors.append("an inserted id returned a row other than its initial row")
            seen.append(ids)

    def reader():
        while not stop.is_set():
            rows = table.lookup(upd_ids, members=np.zeros(n_upd, np.int64)).numpy()
            if not np.all(rows == rows[:, :1]):
                errors.append("torn row")

    def flusher():
        while not stop.is_set():
            table.flush()
            table.end_step()

    background = [threading.Thread(target=f) for f in (reader, flusher)]
    workers = [threading.Thread(target=updater, args=(k,)) for k in range(updaters)]
    workers += [threading.Thread(target=inserter, args=(k,)) for k in range(3)]
    run_racing(background, workers, stop)
    assert not errors, errors[:3]
    ids, rows, _, counts, _, _, mem = (t.numpy() for t in table.export_with_members())
    new = mem == 1
    all_new = np.concatenate(seen)
    uniq, occurrences = np.unique(all_new, return_counts=True)
    np.testing.assert_array_equal(ids[new], uniq)  # every racing id stored exactly once
    np.testing.assert_array_equal(counts[new], occurrences)  # no count lost
    np.testing.assert_array_equal(rows[new], reference.lookup(uniq, insert=False))
    np.testing.assert_array_equal(rows[~new], np.full((n_upd, DIM), rounds, np.float32))
    stats = table.stats()
    assert stats["size"] == stats["inserts"] == n_upd + len(uniq)

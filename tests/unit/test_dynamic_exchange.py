"""Which rank owns a dynamic table's id (``distribute/dynamic_exchange.py``), checked in one process.

The owner function is SplitMix64's finalizer modulo the number of ranks: the
TF and NumPy versions agree with a plain-Python reference on edge ids, and
ownership is balanced both for small sequential ids and for ids whose low
bits are all equal (where ``id % n`` would put every id on one rank).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hybridtf._src.distribute import dynamic_exchange
from hybridtf._src.distribute.world import World

M64 = (1 << 64) - 1


def _reference(i: int, n: int) -> int:
    z = (i + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return (z ^ (z >> 31)) % n


EDGE_IDS = [0, 1, 2, 3, -1, -2, 2**63 - 1, -(2**63), 12345678901234, -987654321]


@pytest.mark.parametrize("size", [2, 3, 8])
def test_owner_matches_the_reference_in_tf_and_numpy(size):
    ids = np.array(EDGE_IDS, np.int64)
    want = [_reference(int(i) & M64, size) for i in EDGE_IDS]
    assert dynamic_exchange.owner_of(tf.constant(ids), size).numpy().tolist() == want
    assert dynamic_exchange.owner_of_numpy(ids, size).tolist() == want

    @tf.function
    def traced(x):
        return dynamic_exchange.owner_of(x, size)

    assert traced(tf.constant(ids)).numpy().tolist() == want


@pytest.mark.parametrize(
    "ids",
    [np.arange(4096, dtype=np.int64), np.arange(4096, dtype=np.int64) << 20],  # sequential; low 20 bits all 0
    ids=["sequential", "equal_low_bits"],
)
def test_ownership_is_balanced(ids):
    for size in (2, 4, 7):
        share = np.bincount(dynamic_exchange.owner_of_numpy(ids, size), minlength=size) / ids.size
        assert share.min() > 0.8 / size and share.max() < 1.2 / size, (size, share)


def test_own_part_keeps_the_rows_a_rank_owns_in_order():
    ids = tf.constant(np.arange(-50, 50, dtype=np.int64))
    rows = tf.reshape(tf.range(200, dtype=tf.float32), [100, 2])
    slots = tf.reshape(tf.range(400, dtype=tf.float32), [100, 2, 2])
    counts = tf.range(100, dtype=tf.int64)
    seen = []
    for rank in range(3):
        part = dynamic_exchange.own_part(ids, rows, slots, counts, World(rank, 3))
        owners = dynamic_exchange.owner_of_numpy(part[0].numpy(), 3)
        assert (owners == rank).all()
        pos = part[0].numpy() + 50
        assert np.array_equal(part[1].numpy(), rows.numpy()[pos]) and np.array_equal(
            part[2].numpy(), slots.numpy()[pos]
        )
        assert np.array_equal(part[3].numpy(), pos) and (np.diff(pos) > 0).all()
        seen.extend(pos.tolist())
    assert sorted(seen) == list(range(100))

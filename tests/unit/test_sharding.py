"""Sharding rules (plan stage) and the synthetic id generator."""

from __future__ import annotations

import numpy as np
import pytest

from hybridtf._src.data.synthetic import uniform_ids, zipf_ids
from hybridtf._src.plan import sharding


@pytest.mark.parametrize(
    "rows,parts,expected",
    [(10, 3, [0, 4, 7, 10]), (8, 4, [0, 2, 4, 6, 8]), (2, 4, [0, 1, 2, 2, 2]), (0, 2, [0, 0, 0]), (5, 1, [0, 5])],
)
def test_even_range_bounds(rows, parts, expected):
    assert sharding.even_range_bounds(rows, parts).tolist() == expected


def test_even_range_bounds_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_rows must be a non-negative int"):
        sharding.even_range_bounds(-1, 2)
    with pytest.raises(ValueError, match=r"num_partitions must be in \[1, 4096\]"):
        sharding.even_range_bounds(10, 0)


def test_owner_of_matches_bounds():
    bounds = np.array([0, 3, 3, 10])
    owners = sharding.owner_of(np.arange(10), 3, "range", bounds)
    assert owners.tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 2, 2]
    assert sharding.owner_of(np.array([-1, 5]), 4).tolist() == [3, 1]


def test_zipf_ids_are_skewed_in_range_and_reproducible():
    ids = zipf_ids(100_000, 50_000, alpha=1.1, seed=4)
    assert ids.min() >= 0 and ids.max() < 50_000
    counts = np.bincount(ids)
    assert counts.max() > 50 * 100_000 / 50_000  # the hottest id is far above uniform
    np.testing.assert_array_equal(ids, zipf_ids(100_000, 50_000, alpha=1.1, seed=4))
    hot = np.argsort(counts)[-10:]
    assert not np.array_equal(np.sort(hot), np.arange(10))  # scattered, not 0..9


def test_zipf_scatter_is_a_bijection():
    # With a flat exponent every rank is drawn, so a bijection must reach every id.
    vocab = 1000
    scattered = zipf_ids(200_000, vocab, alpha=0.5, seed=1)
    plain = zipf_ids(200_000, vocab, alpha=0.5, seed=1, scatter=False)
    assert len(np.unique(plain)) == vocab
    assert len(np.unique(scattered)) == vocab
    # Same draws, relabelled: the multiset of counts is unchanged.
    np.testing.assert_array_equal(np.sort(np.bincount(scattered)), np.sort(np.bincount(plain)))


def test_uniform_ids_bounds_and_dtype():
    ids = uniform_ids(1000, -5, 5, seed=0, dtype=np.int32)
    assert ids.dtype == np.int32 and ids.min() >= -5 and ids.max() < 5

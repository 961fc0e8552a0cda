"""Synthetic, schema-faithful id streams for tests, benchmarks and demos.

Real CTR features are Zipf-skewed: a few hot ids carry most lookups. The ids
returned here follow a bounded Zipf law over a vocabulary and are scattered
over the id space by an invertible multiplicative hash, so hot ids are not
simply 0, 1, 2, ... (as after feature hashing in production).
"""

from __future__ import annotations

import numpy as np

from hybridtf._src.data.errors import DataValueError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def zipf_ranks(n: int, vocab: int, alpha: float = 1.1, seed: int = 0) -> np.ndarray:
    """``n`` ranks in ``[0, vocab)`` with P(rank k) proportional to 1 / (k + 1)**alpha."""
    if vocab < 1 or n < 0:
        raise DataValueError(f"need vocab >= 1 and n >= 0, got vocab={vocab}, n={n}.")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n), side="right")
    return np.minimum(ranks, vocab - 1).astype(np.int64)


def zipf_ids(n: int, vocab: int, alpha: float = 1.1, seed: int = 0, dtype=np.int64, scatter: bool = True) -> np.ndarray:
    """Zipf-skewed ids in ``[0, vocab)``; with ``scatter`` hot ids are spread out.

    Args:
        n: number of ids.
        vocab: vocabulary size (ids are in ``[0, vocab)``).
        alpha: Zipf exponent (about 1.0-1.2 for CTR features).
        seed: random seed.
        dtype: np.int32 or np.int64.
        scatter: map ranks to ids with a bijection of ``[0, vocab)``.

    Returns:
        1-D array of ``n`` ids.
    """
    ranks = zipf_ranks(n, vocab, alpha, seed)
    if scatter and vocab > 1:
        if vocab > 2**31:
            raise DataValueError(f"scatter supports vocab <= 2**31, got {vocab}.")
        # k -> (a * k + b) mod vocab with gcd(a, vocab) == 1 is a bijection;
        # a, k < 2**31 keeps a * k inside int64.
        a = int(_GOLDEN % np.uint64(vocab)) | 1
        while np.gcd(a, vocab) != 1:
            a += 2
        ranks = (ranks * np.int64(a) + 12345) % vocab
    return ranks.astype(dtype)


def uniform_ids(n: int, low: int, high: int, seed: int = 0, dtype=np.int64) -> np.ndarray:
    """``n`` ids drawn uniformly from ``[low, high)``."""
    return np.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64).astype(dtype)

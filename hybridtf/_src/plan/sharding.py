"""How ids map to their owning partition (rank) under model-parallel sharding.

Two strategies, implemented identically by the UniquePartition kernels:

* ``"mod"``: partition ``id % num_partitions`` with a non-negative remainder
  (Python semantics), so negative hashed ids are fine.
* ``"range"``: contiguous ranges ``[bounds[p], bounds[p + 1])`` over
  ``[0, bounds[-1])``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybridtf._src.limits import INT64_MAX

MAX_PARTITIONS = 4096
STRATEGIES = ("mod", "range")


def check_num_partitions(num_partitions: int) -> int:
    """Returns num_partitions as int, or raises ValueError naming the limit."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
        raise TypeError(f"num_partitions must be an int, got {type(num_partitions).__name__}.")
    if not 1 <= int(num_partitions) <= MAX_PARTITIONS:
        raise ValueError(
            f"num_partitions must be in [1, {MAX_PARTITIONS}], got {num_partitions}. "
            "Use the number of ranks that own embedding shards."
        )
    return int(num_partitions)


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
    return strategy


def even_range_bounds(num_rows: int, num_partitions: int) -> np.ndarray:
    """Bounds that split ``[0, num_rows)`` into near-equal contiguous ranges.

    The first ``num_rows % num_partitions`` partitions get one row more than the
    others (the layout of TensorFlow's "div" partition strategy).

    Args:
        num_rows: rows of the table (its vocabulary size), >= 0.
        num_partitions: number of partitions, 1..4096.

    Returns:
        int64 array of ``num_partitions + 1`` non-decreasing bounds, first 0,
        last ``num_rows``.

    Example:
        >>> even_range_bounds(10, 3).tolist()
        [0, 4, 7, 10]
    """
    num_partitions = check_num_partitions(num_partitions)
    if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or num_rows < 0:
        raise ValueError(f"num_rows must be a non-negative int, got {num_rows!r}.")
    if int(num_rows) > INT64_MAX:
        raise ValueError(f"num_rows must fit int64 (at most 2**63 - 1), got {num_rows}: the bounds are int64.")
    base, extra = divmod(int(num_rows), num_partitions)
    sizes = np.full(num_partitions, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def check_range_bounds(bounds: Sequence[int] | np.ndarray, num_partitions: int) -> np.ndarray:
    """Validates explicit range bounds; returns them as an int64 array."""
    arr = np.asarray(bounds)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"range_bounds must be a 1-D integer sequence, got shape {arr.shape} dtype {arr.dtype}.")
    if arr.shape[0] != num_partitions + 1:
        raise ValueError(
            f"strategy 'range' with num_partitions={num_partitions} needs num_partitions + 1 = "
            f"{num_partitions + 1} range_bounds, got {arr.shape[0]}. "
            "Build them with even_range_bounds(num_rows, num_partitions)."
        )
    if arr[0] != 0:
        raise ValueError(f"range_bounds[0] must be 0 (ranges cover [0, num_rows)), got {arr[0]}.")
    bad = np.nonzero(arr[1:] < arr[:-1])[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"range_bounds must be non-decreasing, but range_bounds[{i}] = {arr[i]} > "
            f"range_bounds[{i + 1}] = {arr[i + 1]}."
        )
    return arr.astype(np.int64)


def resolve_range_bounds(strategy: str, num_partitions: int, range_bounds, num_rows) -> np.ndarray | None:
    """The bounds a strategy needs: None for "mod", validated int64 for "range"."""
    if strategy == "mod":
        if range_bounds is not None or num_rows is not None:
            raise ValueError("range_bounds and num_rows only apply to strategy='range'; drop them for strategy='mod'.")
        return None
    if (range_bounds is None) == (num_rows is None):
        raise ValueError("strategy='range' needs exactly one of num_rows= (even ranges) or range_bounds= (explicit).")
    if num_rows is not None:
        return even_range_bounds(num_rows, num_partitions)
    return check_range_bounds(range_bounds, num_partitions)


def owner_of(
    ids: np.ndarray, num_partitions: int, strategy: str = "mod", bounds: np.ndarray | None = None
) -> np.ndarray:
    """NumPy reference of the partition function (one owner per id)."""
    ids = np.asarray(ids)
    if strategy == "mod":
        return np.mod(ids.astype(np.int64), num_partitions)
    return np.searchsorted(np.asarray(bounds)[1:], ids, side="right")

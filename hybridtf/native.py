"""hybridtf's algorithms on NumPy arrays, without TensorFlow graphs.

The same TF-free C++ implementation layer that the CPU kernels use, bound with
pybind11 (module ``hybridtf._native``). The planner's warm-up statistics,
data-side tools and the reference tests use it. ``HybridHashStore`` is the
dynamic embedding table's store (Algorithm 1, hot/cold tiers) for the
hit-ratio benchmark and reference tests.
"""

from __future__ import annotations

import numpy as np

from hybridtf._src.errors import NativeModuleError
from hybridtf._src.plan import sharding
from hybridtf._src.run.results import UniquePartitionResult

try:
    from hybridtf import _native
except ImportError as err:  # pragma: no cover - only on a broken install
    raise NativeModuleError(
        f"hybridtf._native is not built ({err}). Fix: pip install --no-build-isolation -e . in the hybridtf checkout."
    ) from err


def unique_partition(
    ids: np.ndarray,
    num_partitions: int,
    strategy: str = "mod",
    *,
    range_bounds=None,
    num_rows: int | None = None,
    out_idx=np.int32,
    sort_ids: bool = False,
) -> UniquePartitionResult:
    """NumPy version of ``hybridtf.ops.unique_partition`` (same contract, same order).

    Args:
        ids: 1-D int32 or int64 array.
        num_partitions: 1..4096.
        strategy: ``"mod"`` or ``"range"``.
        range_bounds: explicit bounds for ``"range"`` (``num_partitions + 1``).
        num_rows: even bounds over ``[0, num_rows)`` for ``"range"``.
        out_idx: np.int32 or np.int64, dtype of ``inverse``.
        sort_ids: ids ascending inside each partition instead of first-occurrence order.

    Returns:
        ``UniquePartitionResult`` of NumPy arrays.

    Raises:
        TypeError: ids are not an int32/int64 array.
        ValueError: bad arguments, or ids outside the range strategy's space.

    Example:
        >>> r = unique_partition(np.array([5, 3, 5, 8, 2]), 2)
        >>> r.unique_ids.tolist(), r.partition_sizes.tolist(), r.inverse.tolist()
        ([8, 2, 5, 3], [2, 2], [2, 3, 2, 0, 1])
    """
    num_partitions = sharding.check_num_partitions(num_partitions)
    strategy = sharding.check_strategy(strategy)
    if np.dtype(out_idx) not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"out_idx must be np.int32 or np.int64, got {out_idx!r}.")
    bounds = sharding.resolve_range_bounds(strategy, num_partitions, range_bounds, num_rows)
    ids = np.asarray(ids)
    out = _native.unique_partition(ids, num_partitions, strategy, bounds, np.dtype(out_idx) == np.int64, sort_ids)
    return UniquePartitionResult(*out)


# HybridHash (kernels/hybrid_hash): the dynamic table's TF-free store on NumPy arrays.
HybridHashStore = _native.HybridHashStore
hybrid_hash_initial_rows = _native.hybrid_hash_initial_rows

__all__ = ["HybridHashStore", "hybrid_hash_initial_rows", "unique_partition"]

"""hybridtf's algorithms on NumPy arrays, without TensorFlow graphs.

The same TF-free C++ implementation layer that the CPU kernels use, bound with
pybind11 (module ``hybridtf._native``). The planner's warm-up statistics,
data-side tools and the reference tests use it. ``HybridHashStore`` is the
dynamic embedding table's store (Algorithm 1, hot/cold tiers) for the
hit-ratio benchmark and reference tests.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from hybridtf._src.errors import NativeModuleError
from hybridtf._src.plan import sharding
from hybridtf._src.run.results import UniquePartitionResult


def _load_native():
    """hybridtf._native, or the build named by HYBRIDTF_NATIVE_MODULE (tools/sanitize.sh's ASan/UBSan build)."""
    override = os.environ.get("HYBRIDTF_NATIVE_MODULE")
    if override:
        spec = importlib.util.spec_from_file_location("hybridtf._native", override)
        if spec is None or not os.path.isfile(override):
            raise NativeModuleError(f"HYBRIDTF_NATIVE_MODULE={override!r} is not a built module file; unset it.")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        import hybridtf._native as module
    except ImportError as err:  # pragma: no cover - only on a broken install
        raise NativeModuleError(
            f"hybridtf._native is not built ({err}). "
            "Fix: pip install --no-build-isolation -e . in the hybridtf checkout."
        ) from err
    return module


_native = _load_native()


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


def pack_ids(ids, row_offsets, num_rows, table_names, on_invalid: str = "error"):
    """NumPy version of ``hybridtf.ops.pack_ids`` (same checks and messages).

    Args:
        ids: one int32/int64 array (or list of ints) per field, any shape (flattened).
        row_offsets: row offset of each field's table in the packed table (>= 0).
        num_rows: vocabulary size of each field's table (>= 0); offset + rows must fit int64.
        table_names: used in error messages.
        on_invalid: ``"error"`` or ``"count"`` (out-of-vocabulary ids become the table's first row).

    Returns:
        ``(packed, field_sizes, invalid_counts)`` int64 arrays.

    Raises:
        TypeError: ids that are not int32/int64 (floats are never truncated).
        ValueError: an id outside its table's vocabulary, or bad offsets / row counts.

    Example:
        >>> pack_ids([np.array([1, 0]), [[2], [2]]], [0, 10], [3, 5], ["a", "b"])[0].tolist()
        [1, 0, 12, 12]
    """
    arrays = []
    for value in ids:
        arr = np.asarray(value)
        if arr.size == 0 and arr.dtype.kind == "f" and not isinstance(value, np.ndarray):
            arr = arr.astype(np.int64)  # a Python [] (float64 to NumPy) is an empty field; a float array is not
        arrays.append(np.ascontiguousarray(arr.reshape(-1)))
    # Offsets and row counts go to C++ as they are: a float raises TypeError (never truncated).
    return _native.pack_ids(arrays, list(row_offsets), list(num_rows), [str(t) for t in table_names], on_invalid)


def stitch_combine(rows, inverse, field_sizes, combiners, *, field_segments=None, segment_lengths=None, weights=None):
    """NumPy version of ``hybridtf.ops.stitch_combine`` (one array per field).

    Args: as ``hybridtf.ops.stitch_combine``; ``rows`` float32/float64 ``[num_unique, dim]``,
    ``inverse`` int32/int64 ``[n]``.

    Returns:
        A list with one ``[rows_f, dim]`` array per field.

    Raises:
        TypeError: dtypes the TF op does not take.
        ValueError: inconsistent sizes, lengths or out-of-range inverse values.

    Example:
        >>> stitch_combine(np.ones((2, 1), np.float32), np.array([0, 1]), [2], ["sum"],
        ...                field_segments=[1], segment_lengths=[2])[0].tolist()
        [[2.0]]
    """
    combiners = [str(c) for c in combiners]
    segments, lengths = _layout(field_sizes, combiners, field_segments, segment_lengths)
    return _native.stitch_combine(
        np.ascontiguousarray(rows),
        np.ascontiguousarray(inverse),
        _int_vector(field_sizes),
        combiners,
        segments,
        lengths,
        weights,
    )


def stitch_combine_grad(
    grads, inverse, field_sizes, combiners, num_unique: int, *, field_segments=None, segment_lengths=None, weights=None
):
    """NumPy version of StitchCombine's gradient: ``d_rows[num_unique, dim]``.

    Example:
        >>> stitch_combine_grad([np.ones((1, 1))], np.array([0, 0]), [2], ["sum"], 1,
        ...                     field_segments=[1], segment_lengths=[2]).tolist()
        [[2.0]]
    """
    combiners = [str(c) for c in combiners]
    segments, lengths = _layout(field_sizes, combiners, field_segments, segment_lengths)
    return _native.stitch_combine_grad(
        [np.ascontiguousarray(g) for g in grads],
        np.ascontiguousarray(inverse),
        _int_vector(field_sizes),
        combiners,
        segments,
        lengths,
        weights,
        int(num_unique),
    )


def _int_vector(value):
    """An integer vector as given; an empty list (float64 to NumPy) is an empty int64 vector, as in TF."""
    arr = np.asarray(value)
    empty_list = arr.size == 0 and arr.dtype.kind == "f" and not isinstance(value, np.ndarray)
    return arr.astype(np.int64) if empty_list else arr


def _layout(field_sizes, combiners, field_segments, segment_lengths):
    """The wrapper's defaults: field_segments = field_sizes, segment_lengths = ones (bags of one)."""
    sizes = _int_vector(field_sizes)
    segments = sizes if field_segments is None else _int_vector(field_segments)
    if segment_lengths is None:
        if sizes.dtype.kind not in "iu":
            raise TypeError(f"field_sizes must be integers, got {sizes.dtype}.")
        total = sum(int(s) for s, c in zip(sizes.reshape(-1), combiners) if c != "none")
        segment_lengths = np.ones([total], np.int64)
    return segments, _int_vector(segment_lengths)


def unique_subset(unique_ids, inverse, field_sizes, source_fields, source_offsets, target_offsets, num_rows):
    """NumPy version of ``hybridtf.ops.unique_subset`` on A's (unique_ids, inverse).

    Returns:
        ``(unique_ids, partition_sizes, inverse, field_sizes)`` of packed table B.

    Raises:
        TypeError / ValueError: as the TF op (InvalidArgument there).

    Example:
        >>> r = unique_subset(np.array([1, 12]), np.array([0, 1]), [1, 1], [1], [10], [0], [5])
        >>> r[0].tolist(), r[2].tolist()
        ([2], [0])
    """
    return _native.unique_subset(
        np.ascontiguousarray(unique_ids),
        np.ascontiguousarray(inverse),
        _int_vector(field_sizes),
        list(source_fields),
        list(source_offsets),
        list(target_offsets),
        list(num_rows),
    )


# HybridHash (kernels/hybrid_hash): the dynamic table's TF-free store on NumPy arrays.
HybridHashStore = _native.HybridHashStore
hybrid_hash_initial_rows = _native.hybrid_hash_initial_rows


__all__ = [
    "HybridHashStore",
    "hybrid_hash_initial_rows",
    "pack_ids",
    "stitch_combine",
    "stitch_combine_grad",
    "unique_partition",
    "unique_subset",
]

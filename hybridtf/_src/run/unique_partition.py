"""Python wrapper of the fused ``HybridTF>UniquePartition`` op."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.plan import sharding
from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.results import UniquePartitionResult

OP_NAME = "HybridTF>UniquePartition"
_ID_DTYPES = (tf.int32, tf.int64)

# Ids, sizes and the inverse index are integers: nothing to differentiate.
tf.no_gradient(OP_NAME)


def _bounds_tensor(strategy, num_partitions, range_bounds, num_rows, dtype):
    if isinstance(range_bounds, (tf.Tensor, tf.Variable)) and tf.get_static_value(range_bounds) is None:
        if strategy != "range" or num_rows is not None:
            raise ValueError("range_bounds only applies to strategy='range', without num_rows.")
        return tf.cast(range_bounds, dtype)  # validated by the kernel at run time
    if isinstance(range_bounds, (tf.Tensor, tf.Variable)):
        range_bounds = tf.get_static_value(range_bounds)
    bounds = sharding.resolve_range_bounds(strategy, num_partitions, range_bounds, num_rows)
    if bounds is None:
        return tf.zeros([0], dtype)
    if dtype == tf.int32 and bounds[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"range_bounds[-1] = {bounds[-1]} does not fit int32 ids; use int64 ids.")
    return tf.constant(bounds, dtype=dtype)


def unique_partition(
    ids,
    num_partitions: int,
    strategy: str = "mod",
    *,
    range_bounds=None,
    num_rows: int | None = None,
    out_idx: tf.DType = tf.int32,
    sort_ids: bool = False,
    name: str | None = None,
) -> UniquePartitionResult:
    """Deduplicates a packed id vector and groups the unique ids by owner, in one op.

    This is PICASSO's fused Unique&Partition: the unique ids, grouped by the
    partition (rank) that owns them, the number of unique ids per partition
    (the alltoall split sizes) and the inverse index, computed in one pass
    instead of a chain of unique / partition / stitch ops.

    Output order is deterministic: partitions in ascending order; inside a
    partition, ids in order of first occurrence in ``ids``. So the segment of
    partition ``p`` equals ``tf.unique(ids[owner(ids) == p]).y``.

    Args:
        ids: 1-D int32 or int64 tensor of ids (may be empty).
        num_partitions: number of partitions, 1..4096.
        strategy: ``"mod"`` (owner ``id % num_partitions``, non-negative
            remainder, any id) or ``"range"`` (contiguous ranges; ids must be
            in ``[0, num_rows)``).
        range_bounds: for ``"range"``: ``num_partitions + 1`` non-decreasing
            bounds starting at 0; partition ``p`` owns
            ``[range_bounds[p], range_bounds[p + 1])``.
        num_rows: for ``"range"``, instead of ``range_bounds``: split
            ``[0, num_rows)`` evenly (see ``even_range_bounds``).
        out_idx: dtype of ``inverse``, tf.int32 (default) or tf.int64.
        sort_ids: order the ids inside each partition ascending instead of by
            first occurrence (a packed table's gathers and updates then walk
            its rows in order).
        name: optional op name.

    Returns:
        ``UniquePartitionResult(unique_ids, partition_sizes, inverse)``:
        ``unique_ids`` 1-D with the dtype of ``ids``; ``partition_sizes``
        int32 ``[num_partitions]``; ``inverse`` ``out_idx`` with the shape of
        ``ids`` and ``tf.gather(unique_ids, inverse) == ids``.

    Raises:
        TypeError: ids are not int32/int64.
        ValueError: bad num_partitions, strategy, bounds, or ids of rank != 1.
        tf.errors.InvalidArgumentError: at run time, for ids outside the
            range strategy's ``[0, num_rows)`` or invalid dynamic inputs.

    Example:
        >>> r = unique_partition(tf.constant([5, 3, 5, 8, 2]), num_partitions=2)
        >>> r.unique_ids.numpy().tolist()      # even ids, then odd ids
        [8, 2, 5, 3]
        >>> r.partition_sizes.numpy().tolist()
        [2, 2]
        >>> r.inverse.numpy().tolist()
        [2, 3, 2, 0, 1]
    """
    num_partitions = sharding.check_num_partitions(num_partitions)
    strategy = sharding.check_strategy(strategy)
    if out_idx not in _ID_DTYPES:
        raise TypeError(f"out_idx must be tf.int32 or tf.int64, got {out_idx!r}.")
    with tf.name_scope(name or "unique_partition"):
        if not isinstance(ids, (tf.Tensor, tf.Variable)):
            ids = tf.convert_to_tensor(ids)
        if ids.dtype not in _ID_DTYPES:
            raise TypeError(
                f"unique_partition: ids must be int32 or int64, got {ids.dtype.name}. "
                "Cast integral ids with tf.cast, or hash string/float features into ids first."
            )
        if ids.shape.rank is not None and ids.shape.rank != 1:
            raise ValueError(
                f"unique_partition: ids must be a vector (rank 1), got shape {ids.shape}. "
                "Flatten packed ids first, e.g. tf.reshape(ids, [-1])."
            )
        bounds = _bounds_tensor(strategy, num_partitions, range_bounds, num_rows, ids.dtype)
        outs = load_ops().hybrid_tf_unique_partition(
            ids, bounds, num_partitions=num_partitions, strategy=strategy, out_idx=out_idx, sorted=bool(sort_ids)
        )
    return UniquePartitionResult(outs.unique_ids, outs.partition_sizes, outs.inverse)


def stock_tf_unique_partition(
    ids, num_partitions: int, strategy: str = "mod", range_bounds=None
) -> UniquePartitionResult:
    """The same three outputs composed from stock TensorFlow ops (no custom op).

    What a model graph does today without hybridtf: unique, owner per unique
    id, a stable sort by owner, per-owner counts and a permuted inverse index.
    Used as the baseline in benchmarks and the demo; the results equal
    ``unique_partition`` exactly.

    Args:
        ids: 1-D int32/int64 tensor.
        num_partitions: number of partitions.
        strategy: "mod" or "range".
        range_bounds: for "range": ``num_partitions + 1`` bounds (tensor or array).

    Returns:
        ``UniquePartitionResult`` of tensors.

    Example:
        >>> r = stock_tf_unique_partition(tf.constant([5, 3, 5, 8, 2], tf.int64), 2)  # doctest: +SKIP
        >>> r.partition_sizes.numpy()  # the same as unique_partition's  # doctest: +SKIP
        array([2, 2], dtype=int32)
    """
    uniq, idx = tf.unique(ids)
    if strategy == "mod":
        owner = tf.math.floormod(uniq, tf.cast(num_partitions, uniq.dtype))
    else:
        owner = tf.searchsorted(tf.cast(range_bounds, uniq.dtype)[1:], uniq, side="right")
    owner = tf.cast(owner, tf.int32)
    order = tf.argsort(owner, stable=True)
    sizes = tf.math.unsorted_segment_sum(tf.ones_like(owner), owner, num_partitions)
    slot = tf.math.invert_permutation(order)
    return UniquePartitionResult(tf.gather(uniq, order), sizes, tf.gather(slot, idx))

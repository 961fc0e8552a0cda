"""Python wrapper of the ``HybridTF>UniqueSubset`` op.

One packed table's sorted ``unique_partition`` result derived from another's
when both look up the same id tensors (e.g. the wide and the deep embedding of
the same features), without deduplicating the ids again.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.run.loader import load_ops
from hybridtf._src.run.results import UniquePartitionResult

OP_NAME = "HybridTF>UniqueSubset"

# Ids, sizes and the inverse index are integers: nothing to differentiate.
tf.no_gradient(OP_NAME)

_ATTRS = ("source_fields", "source_offsets", "target_offsets", "num_rows")


def _int_list(values, what: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        try:
            values = list(values)
        except TypeError:
            raise ValueError(f"unique_subset: {what} must be a sequence of ints, got {values!r}.") from None
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool):
            raise ValueError(f"unique_subset: {what}[{i}] must be an int, got {v!r}.")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise ValueError(f"unique_subset: {what}[{i}] must be an int, got {v!r}.") from None
    return out


def unique_subset(
    source: UniquePartitionResult,
    field_sizes,
    source_fields: Sequence[int],
    source_offsets: Sequence[int],
    target_offsets: Sequence[int],
    num_rows: Sequence[int],
    name: str | None = None,
) -> tuple[UniquePartitionResult, tf.Tensor]:
    """Derives packed table B's sorted unique_partition result from packed table A's.

    Packed table A's rows are the concatenation of member tables; its packed
    ids are its fields' ids, field by field, each plus the packed row offset
    of the field's member table, and ``source`` is
    ``unique_partition(packed_ids_A, 1, sort_ids=True)``. Packed table B looks
    up the same id tensors as some of A's fields (in any order, a field may be
    used more than once) in its own packed row space. This returns exactly
    (bit for bit) ``unique_partition(packed_ids_B, 1, sort_ids=True)`` in a
    few branch-free passes over A's and B's positions, without the ids.

    B field ``k`` reads A field ``source_fields[k]``, whose member table starts
    at row ``source_offsets[k]`` of A; B field ``k``'s member table starts at
    ``target_offsets[k]`` of B; both have ``num_rows[k]`` rows. B's member
    ranges must not overlap, and each member table of A that B reads must be
    looked up by one field of A only (for two fields of A sharing a member
    table, use ``unique_partition`` on B's packed ids). CPU only.

    Args:
        source: A's ``unique_partition(packed_ids_A, num_partitions=1,
            sort_ids=True)`` result (int32/int64 ids and inverse).
        field_sizes: 1-D int64 (or int32) tensor, positions per field of A in
            A's field order; sums to the length of ``source.inverse``.
        source_fields: for each field of B, the index of A's field with the
            same ids.
        source_offsets: for each field of B, the packed row offset in A of that
            A field's member table.
        target_offsets: for each field of B, the packed row offset in B of its
            member table.
        num_rows: for each field of B, the rows of its member table (the same
            as the A member's).
        name: optional name scope.

    Returns:
        ``(result, field_sizes_b)``: ``result`` is
        ``UniquePartitionResult(unique_ids, partition_sizes, inverse)`` of B
        (``unique_ids`` ascending with A's id dtype, ``partition_sizes`` int32
        ``[1]``, ``inverse`` with A's inverse dtype over B's positions, B's
        fields in B order); ``field_sizes_b`` is int64 ``[len(source_fields)]``.

    Raises:
        ValueError: the four lists differ in length, are empty or hold
            non-integers, ``field_sizes`` is not integral, or ``source`` does
            not have one partition.
        tf.errors.InvalidArgumentError: at run time, for unsorted
            ``unique_ids``, ``field_sizes`` that are negative or do not sum to
            the length of the inverse, ``source_fields`` out of range,
            overlapping target ranges, bad offsets / ``num_rows``, an A
            result that does not match the given field mapping, or two A
            fields sharing a member table that B reads.

    Example:
        >>> # A: field 0 -> member rows [0, 10), field 1 -> [10, 30).
        >>> a = unique_partition(tf.constant([3, 3, 7, 10 + 5, 10 + 0], tf.int64), 1, sort_ids=True)
        >>> # B holds only field 1's table, at row 100.
        >>> b, b_sizes = unique_subset(a, [3, 2], [1], [10], [100], [20])
        >>> b.unique_ids.numpy().tolist()  # == unique_partition([105, 100], 1, sort_ids=True)
        [100, 105]
        >>> b.inverse.numpy().tolist(), b_sizes.numpy().tolist()
        ([1, 0], [2])
    """
    lists = {
        what: _int_list(v, what) for what, v in zip(_ATTRS, (source_fields, source_offsets, target_offsets, num_rows))
    }
    lengths = {len(v) for v in lists.values()}
    if len(lengths) != 1 or 0 in lengths:
        got = ", ".join(f"{what}={len(v)}" for what, v in lists.items())
        raise ValueError(
            f"unique_subset: source_fields, source_offsets, target_offsets and num_rows need one entry per "
            f"field of B (at least one), got lengths {got}."
        )
    sizes_shape = getattr(source.partition_sizes, "shape", None)
    if sizes_shape is not None and sizes_shape.rank == 1 and sizes_shape[0] not in (None, 1):
        raise ValueError(
            f"unique_subset: source must be a unique_partition result with num_partitions=1, got "
            f"partition_sizes of shape {sizes_shape}."
        )
    with tf.name_scope(name or "unique_subset"):
        field_sizes = tf.convert_to_tensor(field_sizes)
        if not field_sizes.dtype.is_integer:
            raise ValueError(f"unique_subset: field_sizes must be integers, got {field_sizes.dtype.name}.")
        if field_sizes.dtype != tf.int64:
            field_sizes = tf.cast(field_sizes, tf.int64)
        outs = load_ops().hybrid_tf_unique_subset(source.unique_ids, source.inverse, field_sizes, **lists)
    return (
        UniquePartitionResult(outs.unique_ids_out, outs.partition_sizes, outs.inverse_out),
        outs.field_sizes_out,
    )

"""Python wrapper of the fused ``HybridTF>PackIds`` op (K-packing of ids)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from hybridtf._src.limits import INT64_MAX
from hybridtf._src.run.loader import load_ops

OP_NAME = "HybridTF>PackIds"
tf.no_gradient(OP_NAME)
_ID_DTYPES = (tf.int32, tf.int64)


def _table_int(value, what: str, table) -> int:
    """A row offset / row count: a non-negative int that fits int64 (never a float or bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} of table {table!r} must be an int, got {value!r}.")
    if not 0 <= int(value) <= INT64_MAX:
        raise ValueError(f"{what} of table {table!r} must be in [0, 2**63 - 1], got {value}.")
    return int(value)


def _ids_tensor(value, table) -> tf.Tensor:
    """One field's ids as an int32/int64 tensor; the same dtype rule for tensors, NumPy arrays and lists.

    Python ints become int64; float, bool, unsigned or narrower integer arrays raise TypeError
    (they are never truncated or cast silently).
    """
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int)):
        arr = np.asarray(value)
        if arr.size == 0 and arr.dtype.kind == "f" and not isinstance(value, np.ndarray):
            arr = arr.astype(np.int64)  # a Python [] (float64 to NumPy) is an empty field; a float array is not
        if arr.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise TypeError(
                f"ids of table {table!r} must be int32 or int64, got a {arr.dtype} array. "
                "Cast integral ids explicitly, or hash other features into ids first."
            )
        t = tf.constant(arr)
    else:
        t = tf.convert_to_tensor(value)
    if t.dtype not in _ID_DTYPES:
        raise TypeError(f"ids of table {table!r} must be int32 or int64, got {t.dtype.name}.")
    return t


def pack_ids(
    ids: Sequence,
    row_offsets: Sequence[int],
    num_rows: Sequence[int],
    table_names: Sequence[str],
    name: str | None = None,
    on_invalid: str = "error",
) -> tuple[tf.Tensor, ...]:
    """Packs several fields' ids into one int64 vector in a packed table's row space.

    Field ``f``'s ids (any shape, flattened row-major) must lie in
    ``[0, num_rows[f])``; they are shifted by ``row_offsets[f]`` and
    concatenated in field order. An id outside its table's vocabulary raises
    ``tf.errors.InvalidArgumentError`` naming the table; with
    ``on_invalid="count"`` it is packed as the table's first row instead and
    counted (a distributed step first agrees across ranks on whether any id was
    invalid, then fails on every rank together).

    Args:
        ids: one int32/int64 tensor per field.
        row_offsets: row offset of each field's table inside the packed table.
        num_rows: vocabulary size of each field's table.
        table_names: table names, used in error messages.
        name: optional op name.
        on_invalid: ``"error"`` (default) or ``"count"``.

    Returns:
        ``(packed, field_sizes)``: int64 ``[total]`` and int64 ``[num_fields]``;
        with ``on_invalid="count"`` also ``invalid_counts``, int64
        ``[num_fields]``.

    Example:
        >>> packed, sizes = pack_ids([[1, 0], [[2], [2]]], [0, 10], [3, 5], ["a", "b"])
        >>> packed.numpy().tolist(), sizes.numpy().tolist()
        ([1, 0, 12, 12], [2, 2])
    """
    n = len(ids)
    if n == 0:
        raise ValueError("pack_ids needs at least one field.")
    if not (len(row_offsets) == len(num_rows) == len(table_names) == n):
        raise ValueError(
            f"pack_ids got {n} id tensors but {len(row_offsets)} row_offsets, {len(num_rows)} num_rows "
            f"and {len(table_names)} table_names; give one of each per field."
        )
    if on_invalid not in ("error", "count"):
        raise ValueError(f"on_invalid must be 'error' or 'count', got {on_invalid!r}.")
    row_offsets = [_table_int(o, "row_offsets", t) for o, t in zip(row_offsets, table_names)]
    num_rows = [_table_int(r, "num_rows", t) for r, t in zip(num_rows, table_names)]
    for offset, rows, table in zip(row_offsets, num_rows, table_names):
        if offset + rows > INT64_MAX:
            raise ValueError(
                f"table {table!r}: row_offset {offset} + num_rows {rows} overflows int64, so its packed ids "
                "would wrap around; the packed table's rows must fit int64."
            )
    tensors = [_ids_tensor(value, table) for value, table in zip(ids, table_names)]
    with tf.name_scope(name or "pack_ids"):
        packed, sizes, invalid = load_ops().hybrid_tf_pack_ids(
            tensors,
            row_offsets=row_offsets,
            num_rows=num_rows,
            table_names=[str(t) for t in table_names],
            on_invalid=on_invalid,
        )
        return (packed, sizes, invalid) if on_invalid == "count" else (packed, sizes)

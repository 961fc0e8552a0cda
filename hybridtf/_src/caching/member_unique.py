"""Python wrapper of ``HybridTF>HybridHashUniqueFields``: the distinct (member, id) pairs of a packed store's batch."""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run.loader import load_ops

FIELDS_OP_NAME = "HybridTF>HybridHashUniqueFields"

# Ids, members, inverse and counts are integers: nothing to differentiate.
tf.no_gradient(FIELDS_OP_NAME)


def _int64(value, what: str, vector: bool = False):
    """``value`` as an int64 tensor; TypeError unless integers, ValueError unless a vector (when asked)."""
    t = tf.convert_to_tensor(value, dtype_hint=tf.int64)
    if not t.dtype.is_integer:
        raise TypeError(f"{what} must be integers, got {t.dtype.name}.")
    if vector and t.shape.rank is not None and t.shape.rank != 1:
        raise ValueError(f"{what} must be a vector, got shape {t.shape}.")
    return tf.cast(t, tf.int64) if t.dtype != tf.int64 else t


def unique_member_fields(field_ids, field_members, name: str | None = None):
    """The distinct (member, id) pairs of a packed store's batch, one tensor per field, in one op.

    A packed HybridHash store keys its rows by (member, id): the same id in two
    member tables is two rows. ``field_ids[f]`` (any shape, read flat) holds the
    ids of field ``f``, of member ``field_members[f]``; positions run over the
    fields in order, and the fields are never concatenated. The pairs are kept
    in order of first occurrence (what ``tf.unique`` of the pairs would give),
    without packing bits of the id.

    Args:
        field_ids: one int tensor (any shape) per field.
        field_members: ``[num_fields]`` int64 member index of each field in its store.
        name: optional op name.

    Returns:
        ``(unique_ids, unique_members, inverse, counts)``: int64 ``[U]``, int64
        ``[U]``, int32 ``[n]`` (n: all the fields' ids) with
        ``(unique_members[inverse[i]], unique_ids[inverse[i]]) == (member of i, id i)``,
        and int64 ``[U]`` occurrences of each pair.

    Raises:
        TypeError: ids or members are not integers.
        ValueError: no fields, or a members count that differs from the fields'.
        tf.errors.InvalidArgumentError: members out of ``[0, 2**20)`` or more
            than ``2**31 - 1`` ids.

    Example:
        >>> u, m, inv, c = unique_member_fields([[7, 7], [[7], [9]]], [0, 1])
        >>> u.numpy().tolist(), m.numpy().tolist(), inv.numpy().tolist(), c.numpy().tolist()
        ([7, 7, 9], [0, 1, 1], [0, 0, 1, 2], [2, 1, 1])
    """
    with tf.name_scope(name or "unique_member_fields"):
        fields = [_int64(value, f"unique_member_fields: field {f}'s ids") for f, value in enumerate(field_ids)]
        if not fields:
            raise ValueError("unique_member_fields: pass at least one field of ids.")
        members = _int64(field_members, "unique_member_fields: field_members", vector=True)
        if members.shape[0] is not None and members.shape[0] != len(fields):
            raise ValueError(
                f"unique_member_fields: {len(fields)} fields but {members.shape[0]} field_members; pass one per field."
            )
        return load_ops().hybrid_tf_hybrid_hash_unique_fields(fields, members)


__all__ = ["unique_member_fields"]

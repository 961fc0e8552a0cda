"""Validation and normalization of the ids of one lookup, shared by every lookup path.

``prepare_ids`` is used by the functional API (``lookup_api``), the
``EmbeddingBag`` layer, Estimator capture and the dynamic (HybridHash) tables;
it depends on nothing above ``plan/``, so each of them can import it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.plan.tables import COMBINERS

_INT_DTYPES = (tf.int32, tf.int64)
_IDS_KINDS = "a tf.Tensor (or array-like), tf.RaggedTensor or tf.SparseTensor of int32/int64 ids"


def _check_dtype(dtype: tf.DType, table: str, cast_floats: bool) -> tf.DType | None:
    """The dtype to cast ids to (None: keep), or TypeError for non-integer ids."""
    if dtype in _INT_DTYPES:
        return None
    if cast_floats and (dtype.is_floating or dtype.is_integer):
        return tf.int32 if dtype.is_floating else tf.int64
    raise TypeError(
        f"embedding table {table!r}: ids must be int32 or int64, got {dtype.name}. Cast whole-number ids with "
        "tf.cast(ids, tf.int64); hash strings first (tf.strings.to_hash_bucket_fast, or a Keras Hashing / "
        "StringLookup layer)."
    )


def sparse_bags(ids: tf.SparseTensor, table: str = "ids") -> tf.RaggedTensor:
    """The bags of a rank-2 ``tf.SparseTensor`` as a ``tf.RaggedTensor`` ``[batch, None]``.

    Row ``i``'s bag holds the values whose index is ``[i, j]`` for any ``j``, in
    increasing ``j``: indices need not be in row-major order (a hand-built or
    concatenated SparseTensor) nor contiguous in ``j`` (``tf.sparse.from_dense``
    of a row with zeros between ids), as for ``tf.nn.safe_embedding_lookup_sparse``.
    ``tf.sparse.reorder`` passes an ordered tensor through unchanged. The row
    splits come from ``BagSplits`` (``run/bag_splits.py``): a row index outside
    ``[0, dense_shape[0])`` fails there, naming ``table``, without assertion ops
    (the bags can be computed twice: ``hybridtf.function`` lifts them); in an
    export, from TensorFlow's ``RaggedTensor.from_value_rowids``.

    Example:
        >>> sp = tf.SparseTensor([[1, 0], [0, 2]], tf.constant([5, 7], tf.int64), [2, 3])
        >>> sparse_bags(sp).to_list()
        [[7], [5]]
    """
    ids = tf.sparse.reorder(ids)
    if _exporting():  # plain ops: an export loads and serves without hybridtf
        return tf.RaggedTensor.from_value_rowids(ids.values, ids.indices[:, 0], nrows=ids.dense_shape[0])
    from hybridtf._src.run.bag_splits import bags_from_sparse

    return bags_from_sparse(ids, table)


def _exporting() -> bool:
    """Whether the ops built now go into a SavedModel export or another graph of plain ops (an Estimator's
    PREDICT graph): there a bag's row splits are checked by TensorFlow's ops, not by ``BagSplits``, which a
    process without hybridtf cannot load (found by a probe: a DynamicEmbedding bag's export failed to load)."""
    from hybridtf._src.capture import context

    return context.in_plain_ops()


def prepare_ids(ids, combiner: str, table: str, *, cast_floats: bool = False, check_splits: bool = False):
    """Validates and normalizes the ids of one lookup.

    One-hot lookups (``combiner="none"``) keep dense or ragged ids as they
    are. Multi-hot lookups (``"sum" | "mean" | "sqrtn"``) get a rank-2
    ``tf.RaggedTensor`` ``[batch, None]``: a ``tf.SparseTensor`` becomes ragged
    (its indices must be in canonical row-major order, see
    ``tf.sparse.reorder``), and dense ``[batch, L]`` ids become bags of ``L``
    ids each.

    Args:
        ids: the ids.
        combiner: ``"none" | "sum" | "mean" | "sqrtn"``.
        table: the table's name, for error messages.
        cast_floats: cast floating ids (and other integer types) to int32 /
            int64 like ``tf.keras.layers.Embedding``; otherwise they are a
            TypeError.
        check_splits: check a given RaggedTensor's row splits (``BagSplits``)
            before its ids are used: for lookups that act on the ids before
            a fused op would check the bags (a HybridHash insert).

    Returns:
        A ``tf.Tensor`` or ``tf.RaggedTensor`` of int32/int64 ids.

    Raises:
        ValueError: unknown combiner, or bags that are not of rank 2.
        TypeError: ids of an unsupported type or dtype, or a SparseTensor
            with ``combiner="none"``.

    Example:
        >>> prepare_ids(tf.constant([[1, 2], [3, 4]]), "sum", "t").row_lengths().numpy()
        array([2, 2])
    """
    if combiner not in COMBINERS:
        raise ValueError(f"embedding table {table!r}: combiner must be one of {COMBINERS}, got {combiner!r}.")
    bag = combiner != "none"
    if isinstance(ids, tf.SparseTensor):
        if not bag:
            raise TypeError(
                f"embedding table {table!r}: a tf.SparseTensor of ids is a multi-hot bag; pass combiner "
                "'sum', 'mean' or 'sqrtn' (one-hot lookups take dense or ragged ids)."
            )
        if ids.shape.rank != 2:
            raise ValueError(f"embedding table {table!r}: multi-hot ids must be of rank 2 [batch, L], got {ids.shape}.")
        cast = _check_dtype(ids.dtype, table, cast_floats)
        if cast is not None:
            ids = tf.SparseTensor(ids.indices, tf.cast(ids.values, cast), ids.dense_shape)
        return sparse_bags(ids, table)
    if isinstance(ids, tf.RaggedTensor):
        cast = _check_dtype(ids.dtype, table, cast_floats)
        if cast is not None:
            ids = tf.cast(ids, cast)
        if bag and (ids.shape.rank != 2 or ids.ragged_rank != 1):
            raise ValueError(
                f"embedding table {table!r}: multi-hot ids must be a rank-2 tf.RaggedTensor [batch, None], "
                f"got shape {ids.shape} with ragged_rank {ids.ragged_rank}."
            )
        if bag and check_splits and not _exporting():
            from hybridtf._src.run.bag_splits import checked_bags

            ids = checked_bags(ids, table)
        return ids
    if not (tf.is_tensor(ids) or isinstance(ids, (np.ndarray, np.integer, int, list, tuple))):
        raise TypeError(f"embedding table {table!r}: ids must be {_IDS_KINDS}, got {type(ids).__name__}.")
    try:
        ids = tf.convert_to_tensor(ids)
    except (TypeError, ValueError) as err:
        raise TypeError(f"embedding table {table!r}: ids must be {_IDS_KINDS}; could not convert them: {err}") from err
    cast = _check_dtype(ids.dtype, table, cast_floats)
    if cast is not None:
        ids = tf.cast(ids, cast)
    if bag:
        if ids.shape.rank != 2:
            raise ValueError(
                f"embedding table {table!r}: dense multi-hot ids must be of rank 2 [batch, L], got shape {ids.shape}."
            )
        ids = tf.RaggedTensor.from_tensor(ids)
    return ids

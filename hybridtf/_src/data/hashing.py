"""Hashing categorical strings into id space, the same way in every process and on every machine.

``id = 0`` for the empty string (a missing value), otherwise
``id = 1 + Fingerprint64(utf-8 bytes) mod (buckets - 1)``, so ids are in
``[0, buckets)`` and 0 is reserved for missing values. Fingerprint64 is
farmhash's fingerprint, which TensorFlow's ``tf.strings.to_hash_bucket_fast``
computes and guarantees not to change; Python's ``hash()`` is salted per
process and never used. There is no per-column salt: equal strings get equal
ids in every column, so columns that share a vocabulary (an ad's category and
the categories in a user's history) can share an embedding table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybridtf._src.data.errors import DataValueError

MISSING_ID = 0
DEFAULT_BUCKETS = 2**20


def check_buckets(buckets: int, what: str = "buckets") -> int:
    """``buckets`` as an int in ``[2, 2**62]`` (id 0 is reserved, so at least 2)."""
    if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(buckets).__name__}.")
    if not 2 <= buckets <= 2**62:
        raise DataValueError(f"{what} must be in [2, 2**62] (id 0 is reserved for missing values), got {buckets}.")
    return int(buckets)


def hash_strings(values: Any, buckets: int = DEFAULT_BUCKETS) -> np.ndarray:
    """Stable ids in ``[0, buckets)`` for categorical strings; ``""`` (missing) is id 0.

    Args:
        values: strings: a sequence or array of ``str`` / ``bytes``, a
            ``tf.Tensor`` of dtype string, or a pyarrow string array.
        buckets: size of the id space (the embedding table's ``input_dim``).

    Returns:
        int64 ids of the same shape as ``values``.

    Raises:
        ValueError: ``buckets`` outside ``[2, 2**62]``.

    Example:
        >>> hash_strings(["", "05db9164", "05db9164"], buckets=1000).tolist()
        [0, 718, 718]
    """
    import tensorflow as tf

    buckets = check_buckets(buckets)
    if hasattr(values, "dictionary_encode"):  # pyarrow: hash each distinct string once
        import pyarrow as pa

        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        encoded = values.dictionary_encode()
        uniques = hash_strings(encoded.dictionary.to_numpy(zero_copy_only=False), buckets)
        return uniques[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    if not isinstance(values, tf.Tensor):
        values = np.asarray(values, dtype=object)
        if values.size == 0:
            return np.zeros(values.shape, np.int64)
    strings = tf.convert_to_tensor(values)
    if strings.dtype != tf.string:
        raise TypeError(f"hash_strings needs strings, got {strings.dtype.name}; integer ids need no hashing.")
    ids = tf.strings.to_hash_bucket_fast(strings, buckets - 1) + 1
    ids = tf.where(tf.equal(strings, ""), tf.constant(MISSING_ID, tf.int64), ids)
    return ids.numpy()

"""NumPy references for hybridtf's ops, written independently of the kernels."""

from __future__ import annotations

import numpy as np

from hybridtf._src.plan.sharding import owner_of


def unique_partition_reference(ids, num_partitions, strategy="mod", bounds=None, sort_ids=False):
    """(unique_ids, partition_sizes, inverse) by the documented contract.

    Partition segments in ascending order; inside one, distinct ids in order of
    first occurrence; inverse maps every position to its id's slot.
    """
    ids = np.asarray(ids)
    owners = owner_of(ids, num_partitions, strategy, bounds)
    segments, sizes = [], []
    for p in range(num_partitions):
        sub = ids[owners == p]
        values, first = np.unique(sub, return_index=True)
        segments.append(values if sort_ids else sub[np.sort(first)])
        sizes.append(len(segments[-1]))
    unique = np.concatenate(segments).astype(ids.dtype) if segments else ids[:0]
    sorter = np.argsort(unique, kind="stable")
    inverse = sorter[np.searchsorted(unique, ids, sorter=sorter)] if len(ids) else np.zeros(0, np.int64)
    return unique, np.asarray(sizes, np.int32), inverse

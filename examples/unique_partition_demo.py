"""Demo: fused Unique&Partition on a packed batch of 26 Criteo-like feature fields.

A wide-and-deep model looks up 26 categorical fields per example. Packed
(PICASSO D-packing) the fields' tables share one id space (each field gets a
row offset), so one batch is one id vector. Under model-parallel training on 8
ranks every distinct id must be sent once to the rank that owns its row: that
is exactly what HybridTF>UniquePartition computes in one op (unique ids grouped
by owner, the per-owner counts that become alltoall splits, the inverse index
that stitches the rows back). The demo checks it against the stock-TF
composition of the same outputs and times both.

    ./dev.sh demo                     # or: python examples/unique_partition_demo.py --batch 8192
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from example_args import positive_int

import hybridtf as htf
from hybridtf._src.data.synthetic import zipf_ids

# Published cardinalities of the 26 categorical fields of Criteo's display-ads data set.
CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip


def packed_batch(batch: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """One batch of all 26 fields packed into one int64 id vector (field offsets added)."""
    offsets = np.concatenate([[0], np.cumsum(CRITEO_CARDINALITIES)])
    fields = [
        zipf_ids(batch, card, alpha=1.1, seed=seed + f) + offsets[f] for f, card in enumerate(CRITEO_CARDINALITIES)
    ]
    return np.concatenate(fields).astype(np.int64), int(offsets[-1])


def median_ms(fn, ids, reps=10):
    fn(ids)  # trace + warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ids).partition_sizes.numpy()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=positive_int, default=16384, help="examples (each with 26 ids)")
    parser.add_argument("--ranks", type=positive_int, default=8, help="owner ranks (partitions)")
    args = parser.parse_args()

    ids_np, rows = packed_batch(args.batch)
    ids = tf.constant(ids_np)
    try:
        bounds = htf.ops.even_range_bounds(rows, args.ranks)
    except ValueError as e:  # more ranks than the op supports
        parser.error(f"--ranks {args.ranks}: {e}")
    print(f"packed batch: {args.batch} examples x 26 fields = {ids_np.size:,} ids over {rows:,} rows")

    fused = tf.function(lambda x: htf.ops.unique_partition(x, args.ranks, "range", range_bounds=bounds))
    stock = tf.function(lambda x: htf.ops.stock_tf_unique_partition(x, args.ranks, "range", bounds))
    r, ref = fused(ids), stock(ids)
    for name, a, b in zip(r._fields, r, ref):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    np.testing.assert_array_equal(tf.gather(r.unique_ids, r.inverse).numpy(), ids_np)

    sizes = r.partition_sizes.numpy()
    unique = int(sizes.sum())
    print(f"distinct ids: {unique:,} ({ids_np.size / unique:.1f}x fewer rows to fetch than ids)")
    print(f"rows sent to each of {args.ranks} owner ranks (alltoall splits): {sizes.tolist()}")
    print("identical to the stock-TF composition (unique, owner, stable sort, counts, inverse): yes")
    t_fused, t_stock = median_ms(fused, ids), median_ms(stock, ids)
    print(f"fused op: {t_fused:.2f} ms   stock TF: {t_stock:.2f} ms   speedup: {t_stock / t_fused:.2f}x (median of 10)")


if __name__ == "__main__":
    main()

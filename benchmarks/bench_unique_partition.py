"""Micro-benchmark: fused HybridTF>UniquePartition vs the plain-TF composition.

Both compute the same three outputs (unique ids grouped by partition, sizes per
partition, inverse index) on the same Zipf ids, as tf.functions in the same
process. The outputs are checked equal before timing. Prints a table and, last,
one JSON line with the medians and the speedup.

    python benchmarks/bench_unique_partition.py [--n 1000000] [--partitions 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.data.synthetic import zipf_ids


def plain_tf(ids, num_partitions, strategy, bounds):
    """The same three outputs from stock TF ops (what a model graph does today)."""
    return tuple(htf.ops.stock_tf_unique_partition(ids, num_partitions, strategy, bounds))


def fused(ids, num_partitions, strategy, bounds):
    if strategy == "mod":
        return tuple(htf.ops.unique_partition(ids, num_partitions))
    return tuple(htf.ops.unique_partition(ids, num_partitions, "range", range_bounds=bounds))


def time_fn(fn, ids, reps, warmup):
    for _ in range(warmup):
        fn(ids)[1].numpy()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ids)[1].numpy()
        samples.append(time.perf_counter() - t0)
    return samples


def run(n, num_partitions, vocab, alpha, dtype, strategy, reps, warmup):
    ids_np = zipf_ids(n, vocab, alpha, seed=1, dtype=dtype)
    ids = tf.constant(ids_np)
    bounds = tf.constant(htf.ops.even_range_bounds(vocab, num_partitions), dtype=ids.dtype)
    plain_fn = tf.function(lambda x: plain_tf(x, num_partitions, strategy, bounds))
    fused_fn = tf.function(lambda x: fused(x, num_partitions, strategy, bounds))
    for a, b in zip(plain_fn(ids), fused_fn(ids)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    t_plain = time_fn(plain_fn, ids, reps, warmup)
    t_fused = time_fn(fused_fn, ids, reps, warmup)
    med_plain, med_fused = statistics.median(t_plain), statistics.median(t_fused)
    return {
        "n": n,
        "partitions": num_partitions,
        "vocab": vocab,
        "alpha": alpha,
        "dtype": np.dtype(dtype).name,
        "strategy": strategy,
        "unique": len(np.unique(ids_np)),
        "reps": reps,
        "plain_ms_median": round(med_plain * 1e3, 3),
        "fused_ms_median": round(med_fused * 1e3, 3),
        "speedup": round(med_plain / med_fused, 3),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=10_000_000)
    parser.add_argument("--alpha", type=float, default=1.1)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the headline case (int64, mod)")
    args = parser.parse_args(argv)

    cases = [(np.int64, "mod")] if args.quick else [(np.int64, "mod"), (np.int32, "mod"), (np.int64, "range")]
    rows = [run(args.n, args.partitions, args.vocab, args.alpha, d, s, args.reps, args.warmup) for d, s in cases]
    print(f"{'dtype':6} {'strategy':8} {'unique':>8} {'plain ms':>9} {'fused ms':>9} {'speedup':>8}")
    for r in rows:
        print(
            f"{r['dtype']:6} {r['strategy']:8} {r['unique']:8d} {r['plain_ms_median']:9.2f} "
            f"{r['fused_ms_median']:9.2f} {r['speedup']:7.2f}x"
        )
    headline = rows[0]
    print(
        json.dumps(
            {
                "benchmark": "unique_partition",
                "tensorflow": tf.__version__,
                "cpu_count": os.cpu_count(),
                "headline_speedup": headline["speedup"],
                "cases": rows,
            }
        )
    )


if __name__ == "__main__":
    main()

"""Micro-benchmark: fused HybridTF>StitchConcatMatMul vs StitchConcat followed by tf.matmul.

A W&D-like layout: two packed tables (dims 8 and 16) with 107 and 93 one-hot fields, Zipf ids
per field (sorted distinct rows per field, as a packed chain gives them), 13 dense features, a
kernel of ``--units`` columns, batch 4096. Both variants run as tf.functions in the same process,
forward alone and forward + gradient (rows, dense inputs, kernel); the outputs are checked equal
(1e-5 relative to each output's largest value) before timing. Prints a table and, last, one JSON
line with the minima, medians and the speedups. Timings include one tf.function call each (the
same for both variants).

    python benchmarks/bench_stitch_matmul.py [--batch 4096] [--units 64] [--reps 30]
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

from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat, stitch_concat_matmul


def make_group(rng, batch: int, num_fields: int, dim: int, alpha: float) -> StitchGroup:
    """Fields with log-uniform vocabularies and Zipf ids; each field's distinct rows are one sorted range."""
    inverse, offset = [], 0
    for _ in range(num_fields):
        vocab = int(np.exp(rng.uniform(np.log(100), np.log(100_000))))
        ids = rng.zipf(alpha, size=batch).clip(1, vocab)
        unique, inv = np.unique(ids, return_inverse=True)
        inverse.append(inv + offset)
        offset += len(unique)
    sizes = tf.constant([batch] * num_fields, tf.int64)
    return StitchGroup(
        tf.constant(rng.standard_normal((offset, dim)).astype(np.float32) * 0.1),
        tf.constant(np.concatenate(inverse).astype(np.int32)),
        sizes,
        sizes,
        tf.zeros([0], tf.int64),
        ("none",) * num_fields,
    )


def timed(fn, reps: int) -> list[float]:
    for _ in range(3):
        tf.nest.map_structure(lambda t: t.numpy(), fn())
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), fn())
        samples.append(time.perf_counter() - t0)
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=1.1, help="Zipf exponent of the ids")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    groups = [make_group(rng, args.batch, 107, 8, args.alpha), make_group(rng, args.batch, 93, 16, args.alpha)]
    dense = [tf.constant(rng.standard_normal((args.batch, 13)).astype(np.float32))]
    pieces = [(0, f) for f in range(107)] + [(1, f) for f in range(93)] + [(-1, 0)]
    width = 107 * 8 + 93 * 16 + 13
    kernel = tf.constant(rng.standard_normal((width, args.units)).astype(np.float32) * 0.05)
    sources = [g.rows for g in groups] + dense + [kernel]

    variants = {
        "fused": lambda: stitch_concat_matmul(groups, dense, pieces, kernel),
        "unfused": lambda: tf.matmul(stitch_concat(groups, dense, pieces), kernel),
    }

    def with_gradient(fn):
        def step():
            with tf.GradientTape() as tape:
                tape.watch(sources)
                out = fn()
                loss = tf.reduce_sum(out * out)
            return tape.gradient(loss, sources)

        return step

    forward = {name: tf.function(fn) for name, fn in variants.items()}
    backward = {name: tf.function(with_gradient(fn)) for name, fn in variants.items()}
    for table in (forward, backward):
        ref = tf.nest.flatten(table["unfused"]())
        got = tf.nest.flatten(table["fused"]())
        for a, b in zip(got, ref):  # float rounding only: relative to the largest value
            scale = max(float(np.abs(b.numpy()).max()), 1e-30)
            if float(np.abs(a.numpy() - b.numpy()).max()) > 1e-5 * scale:
                raise AssertionError("fused and unfused results differ by more than float rounding")

    distinct = [int(g.rows.shape[0]) for g in groups]
    results = {}
    print(f"batch {args.batch}, 200 fields, width {width}, units {args.units}, distinct rows {distinct}")
    print(f"{'pass':18s} {'unfused ms':>11s} {'fused ms':>9s} {'speedup':>8s}   (min of {args.reps})")
    for label, table in (("forward", forward), ("forward+gradient", backward)):
        runs = {name: timed(fn, args.reps) for name, fn in table.items()}
        best = {name: min(s) * 1e3 for name, s in runs.items()}
        results[label] = {
            "unfused_ms_min": best["unfused"],
            "fused_ms_min": best["fused"],
            "unfused_ms_median": statistics.median(runs["unfused"]) * 1e3,
            "fused_ms_median": statistics.median(runs["fused"]) * 1e3,
            "speedup": best["unfused"] / best["fused"],
        }
        print(f"{label:18s} {best['unfused']:11.2f} {best['fused']:9.2f} {results[label]['speedup']:7.2f}x")
    print(json.dumps({"benchmark": "stitch_matmul", "args": vars(args), "distinct_rows": distinct, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

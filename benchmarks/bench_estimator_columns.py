"""Estimator throughput of TF1 model_fns: the plain model_fn vs ``hybridtf.estimator.model_fn``.

A TF1-style Wide & Deep model_fn, as Estimator CTR code is written, with a 256-128 ReLU tower and
Adagrad. ``--tables columns`` (default): feature columns, ``input_layer`` over one ``embedding_column``
per field (identity columns, dim 8, mean combiner) for the deep part and ``linear_model`` over the
same categorical columns for the wide part. ``--tables get_variable``: the model_fn's own tables,
one ``tf.compat.v1.get_variable`` ``[vocab, 8]`` deep and ``[vocab, 1]`` wide table per field,
looked up with ``tf.nn.embedding_lookup``. The same model_fn runs plain and wrapped in the
same process on the same batches (Zipf ids); a hook times the steps after the warm-up.

Prints samples/s per variant and one JSON line; writes JSON + PNG to ``--out-dir``.
``--repeats N`` alternates the variants N times and keeps each one's best.

    python benchmarks/bench_estimator_columns.py [--tables columns|get_variable] [--fields 26] [--batch 4096]
        [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import hybridtf.estimator as htf_estimator

REPO = Path(__file__).resolve().parent.parent


def _columns(features, fields: int, vocab: int, dim: int):
    """Deep input and wide logit through feature columns."""
    cats = [tf.feature_column.categorical_column_with_identity(f"C{i}", vocab) for i in range(fields)]
    deep = tf.compat.v1.feature_column.input_layer(features, [tf.feature_column.embedding_column(c, dim) for c in cats])
    return deep, tf.compat.v1.feature_column.linear_model(features, cats)


def _get_variable(features, fields: int, vocab: int, dim: int):
    """Deep input and wide logit through tables of the model_fn's own (get_variable + embedding_lookup)."""
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.05)
    deep, wide = [], []
    for i in range(fields):
        ids = tf.reshape(features[f"C{i}"], [-1])
        table = tf.compat.v1.get_variable(f"deep/C{i}", [vocab, dim], initializer=init)
        deep.append(tf.nn.embedding_lookup(table, ids))
        weights = tf.compat.v1.get_variable(f"wide/C{i}", [vocab, 1], initializer=tf.zeros_initializer())
        wide.append(tf.nn.embedding_lookup(weights, ids))
    return tf.concat(deep, axis=1), tf.add_n(wide)


TABLES = {"columns": _columns, "get_variable": _get_variable}


def make_model_fn(fields: int, vocab: int, dim: int, tables: str = "columns"):
    def model_fn(features, labels, mode):
        deep, wide = TABLES[tables](features, fields, vocab, dim)
        h = tf.keras.layers.Dense(256, activation="relu")(deep)
        h = tf.keras.layers.Dense(128, activation="relu")(h)
        logit = tf.keras.layers.Dense(1)(h) + wide
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def make_input_fn(fields: int, vocab: int, batch: int, steps: int):
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    p /= p.sum()
    n = batch * 8  # 8 distinct batches, repeated
    x = {f"C{i}": rng.choice(vocab, size=(n, 1), p=p).astype(np.int64) for i in range(fields)}
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache()
        return ds.repeat().take(steps).prefetch(1)

    return input_fn


class _StepTimes(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.times = []

    def after_run(self, run_context, run_values):
        self.times.append(time.perf_counter())


def run_variant(kind: str, args) -> float:
    model_fn = make_model_fn(args.fields, args.vocab, args.dim, args.tables)
    if kind == "hybridtf":
        model_fn = htf_estimator.model_fn(model_fn)
    model_dir = tempfile.mkdtemp(prefix=f"bench_est_{kind}_")
    try:
        config = tf.estimator.RunConfig(
            save_checkpoints_steps=None, save_checkpoints_secs=None, log_step_count_steps=None
        )
        est = tf.estimator.Estimator(model_fn, model_dir=model_dir, config=config)
        hook = _StepTimes()
        est.train(make_input_fn(args.fields, args.vocab, args.batch, args.steps), hooks=[hook])
        t = hook.times[args.warmup :]
        return args.batch * (len(t) - 1) / (t[-1] - t[0])
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=int, default=26)
    parser.add_argument("--tables", choices=sorted(TABLES), default="columns")
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    runs = {"plain": [], "hybridtf": []}
    for _ in range(args.repeats):
        for kind, samples in runs.items():
            samples.append(run_variant(kind, args))
            print(f"{args.fields} fields ({args.tables}), {kind:9s} {samples[-1]:10.0f} samples/s", flush=True)
    best = {kind: max(r) for kind, r in runs.items()}
    payload = {
        "benchmark": "estimator_feature_columns" if args.tables == "columns" else "estimator_get_variable",
        "args": {k: str(v) for k, v in vars(args).items()},
        "samples_per_s": best,
        "runs": runs,
        "speedup": best["hybridtf"] / best["plain"],
        "load_average": os.getloadavg(),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = f"bench_estimator_{args.tables}-{args.fields}f-{time.strftime('%Y%m%d-%H%M%S')}"
    (args.out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 4))
        ax.bar(list(best), list(best.values()))
        ax.set_ylabel("samples/s")
        ax.set_title(f"Estimator, {args.tables} tables: {args.fields} fields, batch {args.batch}")
        fig.tight_layout()
        fig.savefig(args.out_dir / f"{name}.png", dpi=110)
    except ImportError:
        print("matplotlib is not installed: no chart")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()

"""DeepFM with tf.estimator, plain vs hybridtf.estimator.model_fn: loss, AUC and examples/s.

The model_fn is ordinary TF1-style code: 26 ``tf.keras.layers.Embedding`` fields (dim k for the
FM and the DNN, dim 1 for the first-order term), the FM interaction, an MLP and a
``tf.compat.v1.train.AdagradOptimizer``. The same model_fn is trained twice from the same initial
weights on the same batches: as it is, and wrapped with ``hybridtf.estimator.model_fn``.

    python examples/deepfm_estimator.py                       # synthetic Criteo-like data
    python examples/deepfm_estimator.py --data ../shared/data/criteo_sample.txt --steps 50

``--data`` reads a Criteo CSV with a header (label, I1..I13, C1..C26; empty cells allowed) with
tf.data: categorical strings are hashed into ``--buckets`` buckets, counts become log(1 + x).
Training repeats the file before batching, so a batch may run across its end and any
``--batch-size`` works, also on the 200-row sample; evaluation reads the file once.

Per model the example prints the training rate (examples/s from ``hybridtf.estimator.hooks()``:
from the start of the first timed step to the end of the last, after ``--warmup`` untimed
steps) and the wall time of the ``Estimator.train`` call of the timed steps, which also
includes building the graph, starting the session and writing checkpoints: the model with
the higher training rate can take longer in wall time on a short run.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np
import tensorflow as tf
from example_args import check_csv_columns, positive_int

import hybridtf.estimator as htf_estimator
from hybridtf._src.data.synthetic import zipf_ids

N_DENSE, N_CAT = 13, 26
CAT = [f"C{i + 1}" for i in range(N_CAT)]
CRITEO_COLUMNS = ["label", *(f"I{i + 1}" for i in range(N_DENSE)), *CAT]


def csv_input_fn(path: str, batch_size: int, buckets: int, repeat: bool):
    """Criteo CSV (header; label, I1..I13, C1..C26) -> ({"dense": [B, 13], "C1".."C26": [B]}, [B, 1])."""
    defaults = [[0.0]] + [[0.0]] * N_DENSE + [[""]] * N_CAT

    def parse(*cols):
        dense = tf.stack([tf.math.log1p(tf.maximum(c, 0.0)) for c in cols[1 : 1 + N_DENSE]], axis=1)
        features = {"dense": dense}
        for name, col in zip(CAT, cols[1 + N_DENSE :]):
            features[name] = tf.strings.to_hash_bucket_fast(col, buckets)
        return features, tf.reshape(cols[0], [-1, 1])

    ds = tf.data.experimental.CsvDataset(path, defaults, header=True, na_value="")
    if repeat:  # training: full batches, running across the end of the file
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=repeat).map(parse)


def synthetic_input_fn(batch_size: int, buckets: int, batches: int, seed: int, repeat: bool):
    """Zipf ids per field, random dense features, labels from a fixed random logistic model."""
    rng = np.random.default_rng(seed)
    n = batch_size * batches
    features = {name: zipf_ids(n, buckets, seed=seed * 100 + i) for i, name in enumerate(CAT)}
    features["dense"] = rng.random((n, N_DENSE), dtype=np.float32)
    weights = np.random.default_rng(1234).normal(size=(N_CAT, buckets)).astype(np.float32)
    logit = sum(weights[i, features[name]] for i, name in enumerate(CAT)) / np.sqrt(N_CAT)
    labels = (rng.random(n) < 1 / (1 + np.exp(-2 * logit))).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)
    return ds.repeat() if repeat else ds


def deepfm_model_fn(features, labels, mode, params):
    """Plain TF1-style DeepFM (Keras layers inside the model_fn, a tf.compat.v1 optimizer)."""
    k, buckets = params["k"], params["buckets"]
    first, second = [], []
    for i, name in enumerate(CAT):
        ids = features[name]
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=i)
        second.append(tf.keras.layers.Embedding(buckets, k, embeddings_initializer=init, name=f"fm_{name}")(ids))
        init1 = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=100 + i)
        first.append(tf.keras.layers.Embedding(buckets, 1, embeddings_initializer=init1, name=f"lr_{name}")(ids))
    v = tf.stack(second, axis=1)  # [B, fields, k]
    fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(v, 1)) - tf.reduce_sum(tf.square(v), 1), 1, keepdims=True)
    x = tf.concat([tf.reshape(v, [-1, N_CAT * k]), features["dense"]], axis=1)
    for j, units in enumerate(params["hidden"]):
        x = tf.keras.layers.Dense(
            units, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=200 + j), name=f"dnn_{j}"
        )(x)
    dnn = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=300), name="out")(x)
    logit = tf.add_n(first) + fm + dnn
    prob = tf.sigmoid(logit)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"prob": prob})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
    metrics = {"auc": tf.compat.v1.metrics.auc(labels, prob)}
    train_op = tf.compat.v1.train.AdagradOptimizer(params["lr"]).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def train_and_evaluate(name, fn, args, batch_size, train_fn, eval_fn):
    config = tf.estimator.RunConfig(tf_random_seed=1, log_step_count_steps=None, save_summary_steps=None)
    params = {"k": args.k, "buckets": args.buckets, "hidden": [64, 32], "lr": 0.05}
    model_dir = tempfile.mkdtemp(prefix=f"deepfm_{name}_")
    est = tf.estimator.Estimator(fn, model_dir=model_dir, config=config, params=params)
    hooks = htf_estimator.hooks(every_n_steps=None, batch_size=batch_size, log_fn=lambda line: None)
    est.train(train_fn, steps=args.warmup, hooks=[])  # graph building, first steps
    start = time.perf_counter()
    est.train(train_fn, steps=args.steps, hooks=hooks)
    wall = time.perf_counter() - start
    stats = hooks[0].stats()
    metrics = est.evaluate(eval_fn)
    rate = stats["examples_per_sec"]
    print(f"{name:8s} eval loss {metrics['loss']:.5f}  AUC {metrics['auc']:.4f}")
    steps = stats["steps"]
    print(
        f"         training rate: {rate:,.0f} examples/s (hook, over the {steps} timed steps; graph building excluded)"
    )
    print(f"         wall time: {wall:.1f} s for Estimator.train of those {steps} steps (graph building included)")
    if stats["packed"]:
        print("         " + hooks[0].report.summary().splitlines()[0])
    return {**metrics, "examples_per_sec": rate, "wall_s": wall}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Criteo CSV with a header (default: synthetic data)")
    parser.add_argument("--steps", type=positive_int, default=200, help="timed training steps per model")
    parser.add_argument("--warmup", type=positive_int, default=5, help="untimed training steps first")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--buckets", type=positive_int, default=10_000, help="rows of every table (hash buckets)")
    parser.add_argument("--k", type=positive_int, default=8, help="embedding dim of the FM / DNN fields")
    args = parser.parse_args(argv)
    if args.data:
        check_csv_columns(parser, args.data, CRITEO_COLUMNS, "Criteo")
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    batch = args.batch_size
    if args.data:

        def train_fn():
            return csv_input_fn(args.data, batch, args.buckets, repeat=True)

        def eval_fn():
            return csv_input_fn(args.data, batch, args.buckets, repeat=False)

    else:

        def train_fn():
            return synthetic_input_fn(batch, args.buckets, 50, seed=0, repeat=True)

        def eval_fn():
            return synthetic_input_fn(batch, args.buckets, 10, seed=1, repeat=False)

    print(
        f"DeepFM, {N_CAT} fields, batch {batch}, {args.warmup} + {args.steps} steps, data: {args.data or 'synthetic'}"
    )
    plain = train_and_evaluate("plain", deepfm_model_fn, args, batch, train_fn, eval_fn)
    packed = train_and_evaluate("hybridtf", htf_estimator.model_fn(deepfm_model_fn), args, batch, train_fn, eval_fn)
    rel = abs(packed["loss"] - plain["loss"]) / abs(plain["loss"])
    print(f"eval loss relative difference plain vs hybridtf: {rel:.2e}")
    print(
        f"hybridtf / plain: training rate {packed['examples_per_sec'] / plain['examples_per_sec']:.2f}x (timed steps); "
        f"wall time {packed['wall_s'] / plain['wall_s']:.2f}x (graph building included: on a short run it can "
        "outweigh faster steps)"
    )


if __name__ == "__main__":
    main()

"""Dynamic tables in an Estimator model_fn on raw 64-bit hashed ids (Avazu-style CSV), no bucketing.

The functional API: one ``DynamicTableConfig`` per categorical column in a
``hybridtf.embedding.Tables`` set (HybridHash tables: hot/cold tiers,
Algorithm 1), looked up from Fingerprint64 ids inside a model_fn wrapped by
``hybridtf.estimator.model_fn``, trained by a TF1 Adagrad passed through
``hybridtf.keras.dynamic_optimizer``. ``hybridtf.estimator.hooks()`` logs each
table's hit ratio, size, inserts and evictions; the checkpoint holds the
tables; a second ``train`` resumes from it.

    python examples/dynamic_estimator_avazu.py [--data ../shared/data/avazu_sample.txt] [--model-dir /tmp/dyn_est]
"""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np
import tensorflow as tf
from example_args import check_csv_columns, positive_int

import hybridtf as htf
import hybridtf.estimator as htf_estimator

COLUMNS = ["site_id", "site_domain", "app_id", "device_model", "device_ip", "C14", "C17", "C20"]
_HERE = pathlib.Path(__file__).resolve()
DEFAULT_DATA = next(  # ../shared/data beside the checkout (also from a worktree one level deeper)
    (p / "shared" / "data" / "avazu_sample.txt" for p in _HERE.parents[2:4] if (p / "shared" / "data").is_dir()),
    _HERE.parents[2] / "shared" / "data" / "avazu_sample.txt",
)


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    strings = np.array([[r[c] for c in COLUMNS] for r in rows])
    ids = tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64), strings.shape).numpy()
    labels = np.array([[float(r["click"])] for r in rows], np.float32)
    return {c: ids[:, i] for i, c in enumerate(COLUMNS)}, labels


def model_fn(features, labels, mode, params):
    tables = htf.embedding.Tables(
        [
            htf.embedding.DynamicTableConfig(c, 8, hot_rows=params["hot_rows"], warmup_steps=2, flush_every=2)
            for c in COLUMNS
        ]
    )
    training = mode == tf.estimator.ModeKeys.TRAIN
    x = tf.concat([tables.lookup(c, features[c], training=training) for c in COLUMNS], axis=1)
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    pred = tf.keras.layers.Dense(1, activation="sigmoid")(x)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    optimizer = htf.keras.dynamic_optimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA, help="Avazu CSV with a header")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--hot-rows", type=positive_int, default=16, help="rows of each table's hot tier")
    parser.add_argument("--steps", type=positive_int, default=20, help="steps of each of the two train calls")
    args = parser.parse_args()
    check_csv_columns(parser, args.data, ["click", *COLUMNS], "Avazu")
    logging.getLogger("hybridtf").setLevel(logging.INFO)
    logging.getLogger("hybridtf").addHandler(logging.StreamHandler(sys.stdout))
    features, labels = load(args.data)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(32)

    model_dir = args.model_dir or tempfile.mkdtemp(prefix="dyn_est_")
    est = tf.estimator.Estimator(
        htf_estimator.model_fn(model_fn), model_dir=model_dir, params={"hot_rows": args.hot_rows}
    )
    est.train(input_fn, steps=args.steps, hooks=htf_estimator.hooks(every_n_steps=10))
    est.train(input_fn, steps=args.steps, hooks=htf_estimator.hooks(every_n_steps=None))  # resumes from the checkpoint
    print("eval:", est.evaluate(lambda: input_fn().take(5)))
    for c in COLUMNS[:3]:
        rows = tf.train.load_variable(model_dir, f"hybridtf_dynamic/{c}/rows")
        print(f"{c:13s} rows in the checkpoint {rows.shape[0]:4d} (distinct values {len(np.unique(features[c])):4d})")


if __name__ == "__main__":
    main()

"""Dynamic embedding tables on raw 64-bit hashed ids (Avazu-style CSV), no bucketing.

Each categorical column's strings become int64 ids with Fingerprint64
(``tf.fingerprint``, bit-cast to int64): every distinct value gets its own row
in a ``hybridtf.layers.DynamicEmbedding`` (a HybridHash table: hot/cold tiers,
Algorithm 1), no collisions, no vocabulary. Trains a small click model with
``fit`` and prints each table's size and hot-tier hit ratio.

    python examples/dynamic_embedding_avazu.py [--data ../shared/data/avazu_sample.txt] [--epochs 2]
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np
import tensorflow as tf
from example_args import check_csv_columns, positive_int

import hybridtf as htf

COLUMNS = ["site_id", "site_domain", "app_id", "device_model", "device_ip", "C14", "C17", "C20"]
DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "avazu_sample.txt"


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    strings = np.array([[r[c] for c in COLUMNS] for r in rows])
    ids = tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64), strings.shape).numpy()
    labels = np.array([[float(r["click"])] for r in rows], np.float32)
    return {c: ids[:, i : i + 1] for i, c in enumerate(COLUMNS)}, labels


def build(hot_rows):
    inputs = {c: tf.keras.Input((1,), dtype=tf.int64, name=c) for c in COLUMNS}
    tables = {
        c: htf.layers.DynamicEmbedding(8, hot_rows=hot_rows, warmup_steps=2, flush_every=2, name=f"emb_{c}")
        for c in COLUMNS
    }
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(tables[c](inputs[c])) for c in COLUMNS])
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(x)), tables


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA, help="Avazu CSV with a header")
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--hot-rows", type=positive_int, default=16, help="rows of each table's hot tier")
    args = parser.parse_args()
    check_csv_columns(parser, args.data, ["click", *COLUMNS], "Avazu")
    features, labels = load(args.data)
    model, tables = build(args.hot_rows)
    model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="binary_crossentropy")
    history = model.fit(
        features, labels, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[htf.keras.HybridHashMetrics()]
    )
    print(f"loss per epoch: {[round(v, 4) for v in history.history['loss']]}")
    for c, layer in tables.items():
        s = layer.stats()
        distinct = len(np.unique(features[c]))
        print(
            f"{c:13s} rows {s['size']:4d} (distinct values {distinct:4d})  hot {s['hot_used']:3d}  "
            f"hit ratio {s['hits'] / max(s['lookups'], 1):.2f}"
        )


if __name__ == "__main__":
    main()

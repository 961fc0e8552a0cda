"""An Estimator model_fn with a DynamicEmbedding under Horovod: trained, saved, evaluated (JSON + NPZ per rank).

Rank ``r`` of ``n`` trains on rows ``[r * B / n, (r + 1) * B / n)`` of every
global batch; under 2 ranks the table is sharded by id and every rank has its
own model_dir (every rank saves: the table is gathered). Also records what
the wrapper says about a ``hybridtf.embedding.Tables`` dynamic table built
before ``hvd.init()`` (not sharded: refused above one rank, by name; tables
the model_fn builds are sharded, ``test_horovod_dynamic_tables.py``).

    horovodrun -np 2 -H localhost:2 --gloo python hvd_dynamic_estimator_worker.py OUT_DIR [adam_end_of_data]

``adam_end_of_data``: TF1 Adam, and three ``train(steps=None)`` calls that each
run their input to the end (the end-of-data decay before each call's last
checkpoint, on every rank's shard).
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the checkout

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import hybridtf as htf
import hybridtf.estimator as htf_estimator
from hybridtf._src.caching.dynamic_table import DynamicTableConfig
from hybridtf._src.capture.context import CaptureError

GLOBAL_BATCH, STEPS, DIM = 32, 10, 4
LOSS_KEY = "hvd_dynamic_estimator_loss"
FIELDS = ("ids", "rows", "slots", "counts", "slot_init", "step")


def global_data(n_batches, seed):
    vocab = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, size=90, dtype=np.int64)
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab.size + 1) ** 1.1
    ids = vocab[rng.choice(vocab.size, size=(GLOBAL_BATCH * n_batches, 3), p=p / p.sum())]
    x = rng.normal(size=(GLOBAL_BATCH * n_batches, 2)).astype(np.float32)
    return ids, x, rng.normal(size=(GLOBAL_BATCH * n_batches, 1)).astype(np.float32)


def input_fn(data, rank, size):
    ids, x, y = data
    per = GLOBAL_BATCH // size
    rows = np.concatenate(
        [np.arange(b * GLOBAL_BATCH + rank * per, b * GLOBAL_BATCH + (rank + 1) * per) for b in range(len(y) // 32)]
    )
    return tf.data.Dataset.from_tensor_slices(({"ids": ids[rows], "x": x[rows]}, y[rows])).batch(per)


def model_fn(features, labels, mode):
    train = mode == tf.estimator.ModeKeys.TRAIN
    table = htf.layers.DynamicEmbedding(DIM, combiner="sum", hot_rows=8, warmup_steps=2, flush_every=3, name="items")
    h = tf.concat([table(features["ids"], training=train), features["x"]], axis=1)
    h = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))(h)
    pred = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=8))(h)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"pred": pred})
    loss = tf.reduce_mean(tf.square(pred - labels))
    if not train:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01) if MODE["adam"] else tf.compat.v1.train.AdagradOptimizer(0.1)
    optimizer = htf.keras.dynamic_optimizer(optimizer)
    if hvd.size() > 1:
        optimizer = htf.horovod.DistributedOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


EARLY = {}  # a Tables built before hvd.init() (main), which a model_fn then uses
MODE = {"adam": False}


def tables_model_fn(features, labels, mode):
    tables = EARLY["tables"]
    emb = tables.lookup("users", features["ids"], combiner="sum", training=True)
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=1, keepdims=True) - labels))
    opt = htf.keras.dynamic_optimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss))


class LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def main():
    out = pathlib.Path(sys.argv[1])
    MODE["adam"] = sys.argv[2:] == ["adam_end_of_data"]
    with tf.Graph().as_default() as early_graph:
        EARLY["tables"] = htf.embedding.Tables([DynamicTableConfig("users", DIM, hot_rows=8)])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result = {"rank": rank, "size": size, "tables_error": None}
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    model_dir = out / f"est_{size}_{rank}"
    est = tf.estimator.Estimator(htf_estimator.model_fn(model_fn), model_dir=str(model_dir), config=config)
    losses = LossHook()
    if MODE["adam"]:  # each call meets the end of its input
        for seed in (3, 9, 11):
            est.train(lambda seed=seed: input_fn(global_data(STEPS, seed), rank, size), steps=None, hooks=[losses])
    else:
        est.train(lambda: input_fn(global_data(STEPS, 3), rank, size), steps=STEPS, hooks=[losses])
    loss = losses.losses
    if size > 1:
        loss = hvd.allreduce(tf.constant(loss, tf.float64), op=hvd.Average, name="losses").numpy().tolist()
    result["losses"] = loss
    evaluation = est.evaluate(lambda: input_fn(global_data(2, 4), rank, size), steps=2)["loss"]
    if size > 1:
        evaluation = hvd.allreduce(tf.constant(evaluation, tf.float64), op=hvd.Average, name="eval").numpy()
    result["eval_loss"] = float(evaluation)
    # PREDICT: every rank serves the whole table from its checkpoint (plain TF ops, no collective)
    ids, x, _ = global_data(1, 6)
    first = {"ids": ids[:8], "x": x[:8]}
    result["predictions"] = [float(p["pred"][0]) for p in est.predict(lambda: tf.data.Dataset.from_tensors(first))]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    np.savez(out / f"table_{size}_{rank}.npz", **{f: reader.get_tensor(f"hybridtf_dynamic/items/{f}") for f in FIELDS})
    if size > 1:  # the Tables built before hvd.init() is refused by name (one process: nothing to refuse)
        with early_graph.as_default():
            features = {"ids": tf.constant([[1, 2, 3]], tf.int64)}
            try:
                htf_estimator.model_fn(tables_model_fn)(features, tf.zeros([1, 1]), tf.estimator.ModeKeys.TRAIN)
            except (CaptureError, ValueError) as err:
                result["tables_error"] = str(err)
    (out / f"dynamic_{size}_{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

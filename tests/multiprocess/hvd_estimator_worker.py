"""One process of the Estimator-under-Horovod test: a wrapped W&D model_fn, trained and evaluated.

The model_fn's tables: Keras Embedding layers, an EmbeddingBag, feature columns (an
``embedding_column`` through ``input_layer``, ``linear_model`` weights) and ``get_variable`` tables
looked up with ``tf.gather`` and ``tf.nn.embedding_lookup_sparse``. Also a canned
``DNNLinearCombinedClassifier`` (Ftrl linear part, Adagrad DNN, both Keras legacy optimizers wrapped by
``htf.horovod.DistributedOptimizer``) through the wrapper, from the checkpoint the single process writes
first (a canned Estimator's dense layers take no seed). And ``warm_start_from`` / ``init_from_checkpoint`` of
a plain model_fn's checkpoint into the sharded tables.

Rank ``r`` of ``n`` trains on rows ``[r * B / n, (r + 1) * B / n)`` of every
global batch; the ranks' mean loss per step must equal one process training
on the global batches. Every rank has its own model_dir: with sharded tables
every rank takes part in saving (the tables are gathered), and evaluation
restores each rank's rows from that checkpoint.

    python tests/multiprocess/hvd_estimator_worker.py OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd

import hybridtf as htf
from hybridtf._src.capture.context import CaptureError
from hybridtf._src.capture.layers import EmbeddingBag
from hybridtf._src.integrations.horovod_hooks import LOCAL_VARIABLES

FIELDS, VOCAB, DIM, GLOBAL_BATCH, STEPS = 6, 40, 4, 64, 30
LOSS_KEY = "hvd_estimator_loss"


def global_data(n_batches, seed):
    rng = np.random.default_rng(seed)
    n = GLOBAL_BATCH * n_batches
    x = {f"C{i}": rng.integers(0, VOCAB - i, size=n).astype(np.int64) for i in range(FIELDS)}
    hist = [rng.integers(0, 30, size=rng.integers(0, 5)).astype(np.int64) for _ in range(n)]
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    return x, hist, y


def input_fn(data, rank, size):
    x, hist, y = data
    per = GLOBAL_BATCH // size
    rows = np.concatenate(
        [np.arange(b * GLOBAL_BATCH + rank * per, b * GLOBAL_BATCH + (rank + 1) * per) for b in range(len(y) // 64)]
    )
    feats = {k: v[rows] for k, v in x.items()}
    lengths = np.array([len(hist[i]) for i in rows], np.int64)
    values = np.concatenate([hist[i] for i in rows]) if len(rows) else np.zeros([0], np.int64)
    feats["hist"] = tf.RaggedTensor.from_row_lengths(values, lengths)
    return tf.data.Dataset.from_tensor_slices((feats, y[rows])).batch(per)


def model_fn(features, labels, mode):
    init = lambda s: tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=s)  # noqa: E731
    deep, wide = [], []
    for i in range(FIELDS):
        ids = features[f"C{i}"]
        deep.append(tf.keras.layers.Embedding(VOCAB - i, DIM, embeddings_initializer=init(i), name=f"emb_C{i}")(ids))
        wide.append(
            tf.keras.layers.Embedding(VOCAB - i, 1, embeddings_initializer=init(50 + i), name=f"wide_C{i}")(ids)
        )
    deep.append(EmbeddingBag(30, DIM, combiner="mean", embeddings_initializer=init(99), name="hist")(features["hist"]))
    # feature-column tables (packed and sharded like the layers'): an embedding_column and linear_model weights
    column = tf.feature_column.categorical_column_with_identity("C0", VOCAB)
    embedding = tf.feature_column.embedding_column(
        column, DIM, initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=123)
    )
    deep.append(tf.compat.v1.feature_column.input_layer(features, [embedding]))
    # tables of the model_fn's own (tf.compat.v1.get_variable), only looked up: packed and sharded too
    raw = [
        tf.compat.v1.get_variable(
            f"raw_C{i}", [VOCAB, DIM], initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=70 + i)
        )
        for i in (1, 2)
    ]
    if _INIT_FROM is not None:  # raw_C2's rows from a checkpoint (the packed variable reads them per rank)
        tf.compat.v1.train.init_from_checkpoint(_INIT_FROM, {"raw_C2": raw[1]})
    deep.append(tf.gather(raw[0], features["C1"]))
    pairs = tf.sparse.from_dense(tf.stack([features["C2"], features["C3"]], axis=1) + 1)  # no example without ids
    pairs = tf.SparseTensor(pairs.indices, pairs.values - 1, pairs.dense_shape)
    deep.append(tf.nn.embedding_lookup_sparse(raw[1], pairs, None, combiner="sqrtn"))
    wide.append(tf.compat.v1.feature_column.linear_model(features, [column]))
    hidden = tf.keras.layers.Dense(16, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=8))
    pred = tf.sigmoid(out(hidden(tf.concat(deep, axis=1))) + tf.add_n(wide))
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"pred": pred})
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
    if hvd.size() > 1 and not _UNWRAPPED:
        wrap = hvd.DistributedOptimizer if _HOROVODS_OWN else htf.horovod.DistributedOptimizer
        optimizer = wrap(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


_HOROVODS_OWN = False  # hvd.DistributedOptimizer (which would average the shards' gradients) in the model_fn
_UNWRAPPED = False  # the optimizer not wrapped at all: the dense gradients are not averaged
_INIT_FROM = None  # a checkpoint the model_fn's init_from_checkpoint reads raw_C2 from


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def build_train_graph(rank, size):
    """The wrapped model_fn's TRAIN graph on one batch, in a graph of its own (as the module flags say)."""
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        iterator = tf.compat.v1.data.make_one_shot_iterator(input_fn(global_data(1, seed=5), rank, size))
        features, labels = iterator.get_next()
        htf.estimator.model_fn(model_fn)(features=features, labels=labels, mode=tf.estimator.ModeKeys.TRAIN)


def unaveraged_warnings(rank, size, unwrapped):
    """The hybridtf warnings about dense gradients not averaged, building the model_fn's TRAIN graph."""
    global _UNWRAPPED
    _UNWRAPPED = unwrapped
    handler = _Warnings()
    logging.getLogger("hybridtf").addHandler(handler)
    try:
        build_train_graph(rank, size)
    finally:
        _UNWRAPPED = False
        logging.getLogger("hybridtf").removeHandler(handler)
    return [m for m in handler.messages if "averages its gradient over the ranks" in m]


def horovods_own_optimizer_error(rank, size):
    """The error building the model_fn with hvd.DistributedOptimizer gives (None: it built)."""
    global _HOROVODS_OWN
    _HOROVODS_OWN = True
    try:
        build_train_graph(rank, size)
        return None
    except CaptureError as error:
        return str(error)
    finally:
        _HOROVODS_OWN = False


def seconds_schedule_error(out, rank, size, train):
    """The error of a train call under tf.estimator.RunConfig's default schedule (a save every 600 s; None: it ran).

    Each rank would save when its own clock says so, entering the checkpoint gather at another step.
    """
    est = tf.estimator.Estimator(
        htf.estimator.model_fn(model_fn), model_dir=os.path.join(out, f"secs_{size}_{rank}"), config=None
    )
    try:
        est.train(lambda: input_fn(train, rank, size), steps=1)
        return None
    except ValueError as error:
        return str(error)


def with_horovods_broadcast_hook(out, rank, size, config, train):
    """The losses of 5 steps with Horovod's own BroadcastGlobalVariablesHook (its recipe) among the hooks.

    hybridtf's wrapper of hvd.broadcast_variables leaves the shards out, so they equal the run without it.
    """
    est = tf.estimator.Estimator(
        htf.estimator.model_fn(model_fn), model_dir=os.path.join(out, f"bcast_{size}_{rank}"), config=config
    )
    losses = LossHook()
    est.train(lambda: input_fn(train, rank, size), steps=5, hooks=[hvd.BroadcastGlobalVariablesHook(0), losses])
    return losses.losses


CANNED_FIELDS = 4


def canned_estimator(model_dir):
    """A W&D canned Estimator whose Keras legacy optimizers go through htf.horovod.DistributedOptimizer."""
    cats = [tf.feature_column.categorical_column_with_identity(f"C{i}", VOCAB) for i in range(CANNED_FIELDS)]
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    return tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=cats,
        dnn_feature_columns=[tf.feature_column.embedding_column(c, DIM) for c in cats],
        dnn_hidden_units=[8],
        linear_optimizer=lambda: htf.horovod.DistributedOptimizer(tf.keras.optimizers.legacy.Ftrl(0.05)),
        dnn_optimizer=lambda: htf.horovod.DistributedOptimizer(tf.keras.optimizers.legacy.Adagrad(0.05)),
        model_dir=model_dir,
        config=config,
    )


def canned_input_fn(data, rank, size):
    keys = [f"C{i}" for i in range(CANNED_FIELDS)]
    return input_fn(data, rank, size).map(lambda f, y: ({k: f[k] for k in keys}, y))


class CannedLossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def begin(self):
        self.shards = len(tf.compat.v1.get_collection(LOCAL_VARIABLES))
        self.loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.loss)

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def canned_run(out, rank, size):
    """Trains the wrapped canned Estimator from the shared starting checkpoint; its losses, eval loss, predictions."""
    import shutil

    start = os.path.join(out, "canned_start")
    if size == 1:  # the starting point of every run: the plain canned Estimator after one step
        canned_estimator(start).train(lambda: canned_input_fn(global_data(1, seed=9), 0, 1), steps=1)
    model_dir = os.path.join(out, f"canned_{size}_{rank}")
    shutil.copytree(start, model_dir)
    canned = canned_estimator(model_dir)
    est = tf.estimator.Estimator(htf.estimator.model_fn(canned.model_fn), model_dir=model_dir, config=canned.config)
    hook = CannedLossHook()
    est.train(lambda: canned_input_fn(global_data(20, seed=3), rank, size), steps=20, hooks=[hook])
    evaluation = est.evaluate(lambda: canned_input_fn(global_data(2, seed=4), rank, size), steps=2)
    data = global_data(1, seed=6)
    predictions = [
        float(p["logistic"][0]) for p in canned.predict(lambda: canned_input_fn(data, 0, 1).take(1).map(lambda f, _: f))
    ]
    return {
        "losses": hook.losses,
        "shards": hook.shards,
        "eval_loss": float(evaluation["loss"]),
        "predictions": predictions,
    }


WARM_STEPS = 8


def warm_run(out, rank, size):
    """warm_start_from (and init_from_checkpoint) of a plain model_fn's checkpoint into sharded tables.

    The one process first trains the plain model_fn a few steps (the checkpoint every run starts from),
    then the plain and the wrapped model_fn warm-start from it: some tables of a packed variable with
    their Adagrad slots (a list of regexes selects slots too), raw_C2 by init_from_checkpoint, the
    others from their initializers. Returns the wrapped run's losses (and, in one process, the plain's).
    """
    global _INIT_FROM
    source = os.path.join(out, "warm_source")
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    if size == 1:
        tf.estimator.Estimator(model_fn, model_dir=source, config=config).train(
            lambda: input_fn(global_data(4, seed=11), 0, 1), steps=4
        )
    settings = tf.estimator.WarmStartSettings(source, vars_to_warm_start=["emb_C[013]", "hist", "wide_C2", "dense"])
    train = global_data(WARM_STEPS, seed=3)
    result = {}
    _INIT_FROM = source
    try:
        for name, fn in [("wrapped", htf.estimator.model_fn(model_fn)), ("plain", model_fn)][: 2 if size == 1 else 1]:
            model_dir = os.path.join(out, f"warm_{name}_{size}_{rank}")
            est = tf.estimator.Estimator(fn, model_dir=model_dir, config=config, warm_start_from=settings)
            hook = LossHook(packed=False)
            est.train(lambda: input_fn(train, rank, size), steps=WARM_STEPS, hooks=[hook])
            result[name] = hook.losses
    finally:
        _INIT_FROM = None
    return result


class LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, packed=True):
        self.losses = []
        self.shards = None
        self.with_packed = packed

    def begin(self):
        self.shards = len(tf.compat.v1.get_collection(LOCAL_VARIABLES))
        if self.with_packed:
            plan = htf.estimator.report_of(tf.compat.v1.get_default_graph()).plan
            self.packed = sorted(m.name for pt in plan.packed_tables for m in pt.members)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    est = tf.estimator.Estimator(
        htf.estimator.model_fn(model_fn), model_dir=os.path.join(args.out, f"est_{size}_{rank}"), config=config
    )
    losses = LossHook()
    train = global_data(STEPS, seed=3)
    est.train(
        lambda: input_fn(train, rank, size), steps=STEPS, hooks=[losses, *htf.estimator.hooks(log_fn=lambda line: None)]
    )
    evaluation = est.evaluate(lambda: input_fn(global_data(2, seed=4), rank, size), steps=2)
    result = {"rank": rank, "size": size, "losses": losses.losses, "eval_loss": float(evaluation["loss"])}
    # PREDICT runs the plain model_fn on the rank's checkpoint (whole tables): no collective, every rank alone
    data = global_data(1, seed=6)
    result["predictions"] = [
        float(p["pred"][0]) for p in est.predict(lambda: input_fn(data, 0, 1).take(1).map(lambda f, _: f))
    ]
    result["shards"] = losses.shards
    result["packed"] = losses.packed
    ckpt = tf.train.latest_checkpoint(os.path.join(args.out, f"est_{size}_{rank}"))
    result["checkpoint_shapes"] = {k: s for k, s in tf.train.list_variables(ckpt) if "emb_C0" in k or "hist" in k}
    result["canned"] = canned_run(args.out, rank, size)
    result["warm"] = warm_run(args.out, rank, size)
    if size > 1:
        result["hvd_optimizer_error"] = horovods_own_optimizer_error(rank, size)
        result["hvd_broadcast_hook_losses"] = with_horovods_broadcast_hook(args.out, rank, size, config, train)
        result["seconds_schedule_error"] = seconds_schedule_error(args.out, rank, size, train)
        result["unaveraged_warnings"] = [unaveraged_warnings(rank, size, unwrapped) for unwrapped in (False, True)]
    with open(os.path.join(args.out, f"estimator_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

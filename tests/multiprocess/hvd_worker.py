"""One process of the Horovod tests: trains the scenarios and writes what it saw as JSON.

Run by tests/multiprocess/test_horovod.py, once as a single process and once
under ``horovodrun -np 2 -H localhost:2 --gloo``. Every process of a run sees
the same global batches; rank ``r`` of ``n`` trains on rows
``[r * B / n, (r + 1) * B / n)`` of each, so the ranks together see exactly
what the single process sees.

    python tests/multiprocess/hvd_worker.py OUT_DIR [--restore CKPT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models

GLOBAL_BATCH = 64
STEPS = 50


def fields():
    return ctr_data.criteo_like_fields(dim=8, max_vocab=300)[:8]


SKEW_FIELDS = [ctr_data.FieldSpec("a", 50, 8), ctr_data.FieldSpec("b", 50, 8), ctr_data.FieldSpec("c", 1000, 8)]


def regularized(fs, seed):
    """Embeddings with Keras L1 / L2 / L1L2 regularizers (strength 0 included) beside an unregularized one."""
    tf.keras.utils.set_random_seed(seed)
    r = tf.keras.regularizers
    regs = [r.l2(1e-3), r.l1(1e-3), r.l1_l2(1e-3, 2e-3), None, r.l2(0.0)]
    ids = {f.name: tf.keras.Input(shape=(), dtype=tf.int64, name=f.name) for f in fs}
    dense = tf.keras.Input(shape=(4,), name="dense")
    embs = [
        tf.keras.layers.Embedding(f.vocab, f.dim, name=f"emb_{f.name}", embeddings_regularizer=regs[i % len(regs)])(
            ids[f.name]
        )
        for i, f in enumerate(fs)
    ]
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(tf.keras.layers.Concatenate()([*embs, dense]))
    return tf.keras.Model({**ids, "dense": dense}, tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden))


def partly_trained(fs, seed):
    """A table under ``tf.stop_gradient`` (no gradient: plain Keras leaves it alone) and an L2-regularized one,
    packed with tables that train."""
    tf.keras.utils.set_random_seed(seed)
    ids = {f.name: tf.keras.Input(shape=(), dtype=tf.int64, name=f.name) for f in fs}
    dense = tf.keras.Input(shape=(4,), name="dense")
    embs = []
    for i, f in enumerate(fs):
        reg = tf.keras.regularizers.l2(1e-3) if i == 1 else None
        emb = tf.keras.layers.Embedding(f.vocab, f.dim, name=f"emb_{f.name}", embeddings_regularizer=reg)(ids[f.name])
        embs.append(tf.keras.layers.Lambda(tf.stop_gradient)(emb) if i == 0 else emb)
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(tf.keras.layers.Concatenate()([*embs, dense]))
    return tf.keras.Model({**ids, "dense": dense}, tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden))


def build(kind, fs=None, seed=7):
    fs = fs or fields()
    if kind == "reg":
        return regularized(fs, seed)
    if kind == "partly_trained":
        return partly_trained(fs, seed)
    if kind == "dlrm":
        return ctr_models.dlrm(fs, 4, hidden=(16, 8), bottom=(8,), seed=seed)
    return ctr_models.wide_and_deep(fs, 4, hidden=(16, 8), seed=seed)


def global_batches(fs=None, steps=STEPS, seed=11):
    return list(ctr_data.generate_batches(fs or fields(), 4, GLOBAL_BATCH, steps, seed=seed))


def local_part(batch, rank, size):
    x, y = batch
    n = GLOBAL_BATCH // size
    return {k: v[rank * n : (rank + 1) * n] for k, v in x.items()}, y[rank * n : (rank + 1) * n]


def eval_batch(fs=None):
    x, _ = ctr_data.generate_batch(fs or fields(), 4, 32, 0, seed=99)
    return ctr_data.to_tensors(x)


def stacked_dataset(batches):
    xs = {k: np.stack([x[k] for x, _ in batches]) for k in batches[0][0]}
    ys = np.stack([y for _, y in batches])
    return tf.data.Dataset.from_tensor_slices((xs, ys))


class EpochLosses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))


def fit(kind, optimizer, rank, size, fs=None, batches=None, epochs=None, **optimize_kwargs):
    fs = fs or fields()
    batches = batches or global_batches(fs)
    # Every rank starts from other random weights: optimize() must make rank 0's the common start.
    model = build(kind, fs, seed=7 + 1000 * rank)
    model(eval_batch(fs))
    model = htf.keras.optimize(model, **optimize_kwargs)
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    record = EpochLosses()
    callbacks = [record]
    if size > 1 and kind == "dlrm":  # the usual Horovod Keras recipe must keep working
        callbacks.append(hvdk.callbacks.BroadcastGlobalVariablesCallback(0))
    data = stacked_dataset([local_part(b, rank, size) for b in batches])
    if epochs:  # a dataset of unknown length, read to its end each epoch
        model.fit(data.filter(lambda *_: True), epochs=epochs, verbose=0, callbacks=callbacks)
    else:
        model.fit(data.repeat(), steps_per_epoch=1, epochs=len(batches), verbose=0, callbacks=callbacks)
    return model, record.losses


def custom_loop(rank, size, steps=20, compiled=False, tape_kind="htf"):
    """``compiled``: the optimizer also compiled into the model (its checkpoint layout), so hooked as ``fit``'s.

    ``tape_kind``: ``"htf"`` averages with ``htf.horovod.DistributedGradientTape``; ``"none"`` averages
    nothing (hybridtf's hook of the step's optimizer must); ``"hvd"`` is Horovod's own tape without the shards
    registered as local sources (refused).
    """
    fs = fields()
    model = build("wdl", fs, seed=3)
    model(eval_batch(fs))
    model = htf.keras.optimize(model)
    optimizer = tf.keras.optimizers.SGD(0.1) if not compiled else tf.keras.optimizers.Adagrad(0.05)
    if compiled:
        model.compile(optimizer=optimizer)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if size > 1 and tape_kind == "htf":
            tape = htf.horovod.DistributedGradientTape(tape, model)
        elif size > 1 and tape_kind == "hvd":
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = []
    for b in global_batches(fs, steps, seed=5):
        x, y = local_part(b, rank, size)
        losses.append(float(step(ctr_data.to_tensors(x), tf.constant(y))))
        if size > 1 and len(losses) == 1:  # Horovod's TF2 recipe: it must leave each rank's table shards alone
            hvd.broadcast_variables(model.variables, root_rank=0)
            opt_vars = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
            hvd.broadcast_variables(opt_vars, root_rank=0)
    return model, losses


def table_only_loop(rank, size, variant, steps=20):
    """A model of tables only (matrix factorization): the sole sign that a step averaged is the shards' scaling.

    ``variant``: ``"tape"`` (hybridtf's tape; the optimizer hooked by the step), ``"compiled"`` (the same,
    the optimizer compiled) or ``"none"`` (the step averages nothing: the hooked optimizer does).
    """
    ids = [tf.keras.Input((1,), dtype=tf.int64, name=n) for n in ("user", "item")]
    uniform = tf.keras.initializers.RandomUniform
    vectors = [
        tf.keras.layers.Flatten()(tf.keras.layers.Embedding(vocab, 8, embeddings_initializer=uniform(-1, 1, seed))(x))
        for x, vocab, seed in zip(ids, (100, 80), (1, 2))
    ]
    model = tf.keras.Model(ids, tf.keras.layers.Activation("sigmoid")(tf.keras.layers.Dot(axes=1)(vectors)))
    model = htf.keras.optimize(model)
    optimizer = tf.keras.optimizers.Adagrad(0.5)
    if variant == "compiled":
        model.compile(optimizer)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if size > 1 and variant != "none":
            tape = htf.horovod.DistributedGradientTape(tape, model)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng, losses = np.random.default_rng(0), []
    for _ in range(steps):
        x = {"user": rng.integers(0, 100, (GLOBAL_BATCH, 1)), "item": rng.integers(0, 80, (GLOBAL_BATCH, 1))}
        x, y = local_part((x, rng.integers(0, 2, (GLOBAL_BATCH, 1)).astype(np.float32)), rank, size)
        losses.append(float(step({k: tf.constant(v) for k, v in x.items()}, tf.constant(y))))
    return losses


def skewed_batches():
    """Ids that all live on rank 0 under range sharding (packed rows [0, 550) of 1100)."""
    batches = global_batches(SKEW_FIELDS, 20, seed=4)
    for x, _ in batches:
        x["c"] = x["c"] % 10
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--restore", help="checkpoint written by the other run (1 -> n ranks)")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result = {"rank": rank, "size": size}
    ev = eval_batch()

    model, result["wdl_losses"] = fit("wdl", tf.keras.optimizers.Adagrad(0.05), rank, size)
    result["wdl_sharded"] = len(htf.horovod.local_variables(model))
    result["wdl_pred"] = model.predict_on_batch(ev).ravel().tolist()
    model.save_weights(os.path.join(args.out, f"wdl_{size}", "ckpt"))

    optimizer = tf.keras.optimizers.Adam(0.01)
    if size > 1:
        optimizer = hvdk.DistributedOptimizer(optimizer)
    model, result["dlrm_losses"] = fit("dlrm", optimizer, rank, size)
    result["dlrm_pred"] = model.predict_on_batch(ev).ravel().tolist()

    model, result["loop_losses"] = custom_loop(rank, size)
    result["loop_pred"] = model.predict_on_batch(ev).ravel().tolist()
    # the step's tape averages; the compiled (hooked) optimizer must not average again
    _, result["loop_compiled_losses"] = custom_loop(rank, size, compiled=True)
    # a step that averages nothing, with an optimizer never compiled: hybridtf's hook averages
    model, result["loop_unaveraged_losses"] = custom_loop(rank, size, tape_kind="none")
    result["loop_unaveraged_pred"] = model.predict_on_batch(ev).ravel().tolist()
    for variant in ("tape", "compiled", "none"):
        result[f"table_only_{variant}_losses"] = table_only_loop(rank, size, variant)
    if size > 1:  # Horovod's tape without the shards registered would allgather their gradients: refused
        try:
            custom_loop(rank, size, steps=1, tape_kind="hvd")
            result["loop_hvd_tape_error"] = None
        except ValueError as err:
            result["loop_hvd_tape_error"] = str(err)

    model, result["skew_losses"] = fit(
        "wdl", tf.keras.optimizers.Adagrad(0.05), rank, size, SKEW_FIELDS, skewed_batches(), shard_strategy="range"
    )

    model, result["replicated_losses"] = fit(  # small tables stay whole on every rank, data-parallel
        "wdl",
        tf.keras.optimizers.Adagrad(0.05),
        rank,
        size,
        batches=global_batches(steps=20),
        replicate_below_rows=10**6,
    )
    result["replicated_sharded"] = len(htf.horovod.local_variables(model))

    # Regularized tables: the penalty's gradient is folded into the shards' fused update after the
    # 1/N scaling (counted once), and added to the replicated tables' gradient after the allreduce.
    _, result["reg_losses"] = fit(
        "reg", tf.keras.optimizers.Adagrad(0.05), rank, size, batches=global_batches(steps=20)
    )
    optimizer = tf.keras.optimizers.Adagrad(0.05)
    if size > 1:
        optimizer = hvdk.DistributedOptimizer(optimizer)
    _, result["reg_replicated_losses"] = fit(
        "reg", optimizer, rank, size, batches=global_batches(steps=20), replicate_below_rows=10**6
    )

    # Sharded packed variables whose tables do not all get a gradient: AdamW's decay keeps the rows of the table
    # under stop_gradient, and at the end of data of unknown length Adam's moments decay on the unregularized
    # tables with gradient only, each rank on its shard's rows of them.
    model, result["kept_losses"] = fit(
        "partly_trained",
        tf.keras.optimizers.AdamW(0.02, weight_decay=0.05),
        rank,
        size,
        batches=global_batches(steps=20),
    )
    result["kept_table"] = model.get_layer(f"emb_{fields()[0].name}").get_weights()[0].tolist()
    model, result["end_of_data_losses"] = fit(
        "partly_trained", tf.keras.optimizers.Adam(0.02), rank, size, batches=global_batches(steps=5), epochs=4
    )
    result["end_of_data_tables"] = [model.get_layer(f"emb_{f.name}").get_weights()[0].tolist() for f in fields()[:3]]

    if args.restore:  # a checkpoint of another number of ranks
        restored = build("wdl")
        restored(ev)
        restored = htf.keras.optimize(restored)
        restored.load_weights(args.restore)
        result["restored_pred"] = restored.predict_on_batch(ev).ravel().tolist()

    if size > 1:  # an id outside the vocabulary on one rank only: every rank fails the step, none hangs
        model = build("wdl")
        model(ev)
        model = htf.keras.optimize(model)
        model.compile(optimizer="sgd", loss="binary_crossentropy")
        x, y = local_part(global_batches(steps=1)[0], rank, size)
        if rank == 1:
            x["C2"] = x["C2"].copy()
            x["C2"][3] = 10_000
        try:
            model.train_on_batch(ctr_data.to_tensors(x), y)
            result["invalid_error"] = None
        except tf.errors.InvalidArgumentError as err:
            result["invalid_error"] = err.message

    if size > 1:  # reductions the shards cannot follow are refused, not trained with other math
        result["reduction_errors"] = []
        for kwargs in ({"op": hvd.Sum}, {"scale_local_gradients": False}):
            model = build("wdl")
            model(ev)
            model = htf.keras.optimize(model)
            try:
                model.compile(
                    hvdk.DistributedOptimizer(tf.keras.optimizers.Adagrad(0.05), **kwargs), "binary_crossentropy"
                )
                x, y = local_part(global_batches(steps=1)[0], rank, size)
                model.train_on_batch(ctr_data.to_tensors(x), y)
                result["reduction_errors"].append(None)
            except ValueError as err:
                result["reduction_errors"].append(str(err))

    if size > 1:  # another exclude= on one rank: the error names the tables each rank packs
        model = build("wdl")
        model(ev)
        try:
            htf.keras.optimize(model, exclude=["emb_C3"] if rank == 1 else [])
            result["plan_error"] = None
        except ValueError as err:
            result["plan_error"] = str(err)
        # ModelCheckpoint on rank 0 only (Horovod's idiom for dense models): each save of sharded tables is a
        # collective, so it is refused when fit starts, not after the collective timeout at the first save
        import time

        model = build("wdl")
        model(ev)
        model = htf.keras.optimize(model)
        model.compile(tf.keras.optimizers.Adagrad(0.05), "binary_crossentropy")
        x, y = local_part(global_batches(steps=1)[0], rank, size)
        path = os.path.join(args.out, "rank0_only", "w")
        callbacks = [tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)] if rank == 0 else []
        start = time.perf_counter()
        try:
            model.fit(ctr_data.to_tensors(x), y, epochs=1, verbose=0, callbacks=callbacks)
            result["rank0_checkpoint_error"] = None
        except ValueError as err:
            result["rank0_checkpoint_error"] = str(err)
        result["rank0_checkpoint_seconds"] = time.perf_counter() - start
        # the same tables, but rank 1's second hidden layer is narrower: Horovod's broadcast of the dense
        # layers would wait in other collectives on each rank (the plan check passed)
        model = ctr_models.wide_and_deep(fields(), 4, hidden=(16, 8 if rank == 0 else 4), seed=7)
        model(ev)
        try:
            htf.keras.optimize(model)
            result["dense_error"] = None
        except ValueError as err:
            result["dense_error"] = str(err)

    with open(os.path.join(args.out, f"result_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""One process of the sharded dynamic-table tests: trains, checkpoints, writes what it saw (JSON + NPZ).

Run by tests/multiprocess/test_horovod_dynamic_sharded.py as one process and
under ``horovodrun -np 2 -H localhost:2 --gloo``. Every process sees the same
global batches; rank ``r`` of ``n`` trains on rows ``[r * B / n, (r + 1) * B / n)``.
``htf.keras.optimize`` packs the two DynamicEmbedding tables into one store,
in one process and on two ranks (there the store is sharded by id); the mixed
model runs both ways: packed, and unpacked (``exclude``: each table sharded on its own).

    python hvd_dynamic_worker.py OUT train                   # exactness (Adagrad, Adam), save c1, train on
    python hvd_dynamic_worker.py OUT train+restore CKPT FIRST  # exactness, then restore CKPT (see restore)
    python hvd_dynamic_worker.py OUT restore CKPT FIRST       # restore, export, train, save c2, train on
    python hvd_dynamic_worker.py OUT diverge                  # uneven batches: must end with an error
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk

import hybridtf as htf
from hybridtf._src.distribute import dynamic_exchange

GLOBAL_BATCH, DIM, STEPS = 32, 4, 12
TABLES = ("bag_emb", "one_emb")
# Small hot tiers, a flush every 3 steps after 2 warm-up steps: flushes happen during every run.
TABLE = {"hot_rows": 8, "warmup_steps": 2, "flush_every": 3}


def batch(step: int):
    """The global batch of ``step``: Zipf-like draws over raw 64-bit ids (negative ones too)."""
    vocab = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, size=120, dtype=np.int64)
    rng = np.random.default_rng(1000 + step)
    p = 1.0 / np.arange(1, vocab.size + 1) ** 1.1
    pick = rng.choice(vocab.size, size=(GLOBAL_BATCH, 4), p=p / p.sum())
    x = {"bag": vocab[pick[:, :3]], "one": vocab[(pick[:, 3:] * 7 + 1) % vocab.size]}
    x["small"] = pick[:, :1] % 50  # a fixed-vocabulary feature (the mixed model's static table)
    x["x"] = rng.normal(size=(GLOBAL_BATCH, 2)).astype(np.float32)
    return x, rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)


def local(arrays, rank: int, size: int):
    n = GLOBAL_BATCH // size
    if isinstance(arrays, dict):
        return {k: v[rank * n : (rank + 1) * n] for k, v in arrays.items()}
    return arrays[rank * n : (rank + 1) * n]


def build(kind: str, size: int, mixed: bool = False, compile: bool = True, pack: bool = True):
    """Two DynamicEmbeddings (+ a static Embedding when ``mixed``) and a dense head, through ``optimize``.

    ``pack``: the DynamicEmbeddings share one store (else ``exclude``: one store, or shard, per layer).
    """
    bag = tf.keras.Input((3,), dtype=tf.int64, name="bag")
    one = tf.keras.Input((1,), dtype=tf.int64, name="one")
    dense = tf.keras.Input((2,), name="x")
    inputs = {"bag": bag, "one": one, "x": dense}
    e1 = htf.layers.DynamicEmbedding(DIM, combiner="sum", seed=11, name="bag_emb", **TABLE)(bag)
    e2 = tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(DIM, seed=12, name="one_emb", **TABLE)(one))
    parts = [e1, e2, dense]
    if mixed:
        inputs["small"] = tf.keras.Input((1,), dtype=tf.int64, name="small")
        init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=9)
        static = tf.keras.layers.Embedding(50, DIM, embeddings_initializer=init, name="static_emb")
        parts.append(tf.keras.layers.Flatten()(static(inputs["small"])))
    h = tf.keras.layers.Concatenate()(parts)
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))(h)
    model = htf.keras.optimize(tf.keras.Model(inputs, out), exclude=() if pack else TABLES)
    inner = {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.1), "adam": lambda: tf.keras.optimizers.Adam(0.01)}
    if kind == "adagrad_hvd_first":  # the other order: dynamic_optimizer(hvd.DistributedOptimizer(opt))
        opt = tf.keras.optimizers.Adagrad(0.1)
        optimizer = htf.keras.dynamic_optimizer(hvdk.DistributedOptimizer(opt) if size > 1 else opt)
        model.compile(optimizer=optimizer, loss="mse")
        return model
    if kind == "adagrad_plain":  # a plain Keras optimizer, no Horovod one: hybridtf averages the dense gradients
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
        return model
    optimizer = htf.keras.dynamic_optimizer(inner[kind]())
    if not compile:
        return model, optimizer
    if size > 1 and not mixed:  # Horovod averages the dense gradients, the hooked optimizer keeps buffers local
        # (mixed: hybridtf averages them, its static table is sharded too)
        optimizer = hvdk.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def build_shared(size: int):
    """One DynamicEmbedding (the only one with its settings) called on two inputs, through ``optimize``."""
    bag = tf.keras.Input((3,), dtype=tf.int64, name="bag")
    one = tf.keras.Input((1,), dtype=tf.int64, name="one")
    shared = htf.layers.DynamicEmbedding(DIM, seed=13, name="shared_emb", **TABLE)
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(shared(bag)), tf.keras.layers.Flatten()(shared(one))])
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(5))(h)
    model = htf.keras.optimize(tf.keras.Model({"bag": bag, "one": one}, out))
    optimizer = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1))
    model.compile(optimizer=hvdk.DistributedOptimizer(optimizer) if size > 1 else optimizer, loss="mse")
    return model


def train(model, first: int, steps: int, rank: int, size: int, step_fn=None) -> list:
    """Per-step losses of the global batch (the mean of the ranks' local losses)."""
    losses = []
    for step in range(first, first + steps):
        x, y = batch(step)
        x, y = local(x, rank, size), local(y, rank, size)
        for key in [k for k in x if k not in model.input]:
            del x[key]
        loss = model.train_on_batch(x, y) if step_fn is None else float(step_fn(x, y))
        if size > 1:
            loss = hvd.allreduce(tf.constant(loss, tf.float64), op=hvd.Average, name="loss").numpy()
        losses.append(float(loss))
    return losses


def unknown_length(first: int, steps: int, rank: int, size: int) -> tf.data.Dataset:
    """This rank's part of global batches ``first..first + steps - 1``, of a length Keras does not know."""
    parts = [batch(step) for step in range(first, first + steps)]
    x = {k: np.concatenate([local(b[0], rank, size)[k] for b in parts]) for k in ("bag", "one", "x")}
    y = np.concatenate([local(b[1], rank, size) for b in parts])
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH // size).filter(lambda *_: True)


def export(model, size: int) -> dict:
    """Every table's whole content (ids ascending), gathered from the shards under Horovod."""
    out = {}
    for name in TABLES:
        table = model.get_layer(name).table
        if size > 1:
            parts = dynamic_exchange.full_export(table, table.world)
        else:
            parts = table.export()
        for key, value in zip(("ids", "rows", "slots", "counts", "slot_init", "step"), parts):
            out[f"{name}/{key}"] = np.asarray(value)
    return out


def save(model, out_dir: str, tag: str, rank: int, size: int) -> None:
    """Every rank saves (the tables are gathered); rank 0 writes the checkpoint any number of ranks restores.

    Also a ``tf.train.Checkpoint``: every rank writes one (a collective gather), each to its own path.
    """
    model.save_weights(os.path.join(out_dir, tag, "ckpt"))
    tf.train.Checkpoint(model=model).write(os.path.join(out_dir, tag, f"tf_rank{rank}", "ckpt"))
    content = export(model, size)
    if rank == 0:
        np.savez(os.path.join(out_dir, f"{tag}_{size}.npz"), **content)


def restore(out_dir: str, ckpt: str, first: int, rank: int, size: int) -> dict:
    """Restores ``ckpt`` (saved after step ``first - 1``), exports, trains, saves c2, trains on."""
    model = build("adam", size)
    model.load_weights(ckpt)
    content = export(model, size)
    if rank == 0:
        np.savez(os.path.join(out_dir, f"restored_{size}.npz"), **content)
    other = build("adam", size)  # the tf.train.Checkpoint written beside it restores the same tables
    tf.train.Checkpoint(model=other).read(os.path.join(os.path.dirname(ckpt), "tf_rank0", "ckpt")).expect_partial()
    from_checkpoint = export(other, size)
    result = {"checkpoint_identical": all(np.array_equal(content[k], from_checkpoint[k]) for k in content)}
    result["after_restore"] = train(model, first, 6, rank, size)
    save(model, out_dir, "c2", rank, size)
    result["after_c2"] = train(model, first + 6, 6, rank, size)
    return result


def custom_loop(size: int):
    """A custom training step: ``hybridtf.horovod.DistributedGradientTape`` keeps the tables' buffers local."""
    model, optimizer = build("adagrad", size, compile=False)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        if size > 1:
            tape = htf.horovod.DistributedGradientTape(tape, model)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return model, step


def static_model(**optimize_kwargs):
    """A small optimized model of two static tables."""
    ids = tf.keras.Input((2,), dtype=tf.int64)
    tables = [tf.keras.layers.Embedding(40, DIM, name=f"static_{k}")(ids) for k in range(2)]
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Concatenate()(tables)))
    return htf.keras.optimize(tf.keras.Model(ids, out), **optimize_kwargs)


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    early = htf.layers.DynamicEmbedding(DIM, name="early")  # built before hvd.init(): not sharded
    early.build(None)
    early_ids = tf.keras.Input((2,), dtype=tf.int64)
    early_model = tf.keras.Model(  # two layers that would share a store, built before hvd.init()
        early_ids, [htf.layers.DynamicEmbedding(DIM, name=f"early_{k}", **TABLE)(early_ids) for k in range(2)]
    )
    early_static = static_model()  # optimized before hvd.init(): laid out for one process
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result = {"rank": rank, "size": size, "early_error": None, "early_static_error": None, "strategy_error": None}
    try:
        early_static.compile(optimizer="adagrad", loss="mse")
    except ValueError as err:
        result["early_static_error"] = str(err)
    try:  # ranks that optimize with different settings: refused at optimize, naming the setting
        static_model(shard_strategy="range" if rank == 1 else "mod")
    except ValueError as err:
        result["strategy_error"] = str(err)
    try:
        early(tf.constant([1, 2], tf.int64), training=True)
    except ValueError as err:
        result["early_error"] = str(err)
    result["early_skipped"] = [s.reason for s in htf.keras.optimize(early_model).hybridtf_skipped]
    if mode == "diverge":  # rank 1 has fewer batches, then saves while rank 0 is still in a training step
        model = build("adagrad", size)
        train(model, 0, 4 - 2 * rank, rank, size)
        model.save_weights(os.path.join(out_dir, "diverged", "ckpt"))
        return
    if mode == "export_alone":  # rank 0 exports (a gather of the whole tables) while rank 1 trains on
        model = build("adagrad", size)
        train(model, 0, 2, rank, size)
        if rank == 0:
            model.export(os.path.join(out_dir, "export_alone"))
        train(model, 2, 2, rank, size)
        return
    if mode.startswith("train"):
        for kind in ("adagrad", "adam"):
            model = build(kind, size)
            adam = model
            result[f"{kind}_losses"] = train(model, 0, STEPS, rank, size)
            stats = [model.get_layer(n).stats() for n in TABLES]
            result[f"{kind}_flushes"] = min(s["flushes"] for s in stats)
            result[f"{kind}_local_sizes"] = [s["size"] for s in stats]
            result[f"{kind}_skipped"] = [s.reason for s in model.hybridtf_skipped]
            x, y = batch(100)  # evaluation: read-only lookups (on 2 ranks a collective, nothing inserted)
            evaluation = model.test_on_batch(local(x, rank, size), local(y, rank, size))
            if size > 1:
                evaluation = hvd.allreduce(tf.constant(evaluation, tf.float64), op=hvd.Average, name=f"eval_{kind}")
            result[f"{kind}_eval"] = float(evaluation)
            result[f"{kind}_size_after_eval"] = model.get_layer(TABLES[0]).stats()["size"]
            # fit with Horovod's broadcast callback (the usual recipe): the tables' per-step buffers of distinct
            # rows differ in size between the ranks and must not break the broadcast
            callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0)] if size > 1 else []
            for step in (STEPS, STEPS + 1):
                x, y = batch(step)
                x, y = local(x, rank, size), local(y, rank, size)
                if "small" not in model.input:
                    del x["small"]
                model.fit(x, y, batch_size=len(y), epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            result[f"{kind}_after_broadcast"] = train(model, STEPS + 2, 2, rank, size)
        # data of unknown length: each epoch ends with a step that finds no batch, in which Keras Adam decays
        # every row's moments and counts the step; each rank decays its shard's stored rows
        model = build("adam", size)
        train(model, 0, 2, rank, size)
        losses = []
        for epoch in range(2):
            loss = model.fit(unknown_length(2, 3, rank, size), epochs=1, verbose=0).history["loss"][0]
            if size > 1:
                loss = hvd.allreduce(tf.constant(loss, tf.float64), op=hvd.Average, name=f"eod_{epoch}").numpy()
            losses.append(float(loss))
        result["end_of_data_losses"] = losses + train(model, 5, 2, rank, size)
        result["end_of_data_iterations"] = int(model.optimizer.iterations)
        result["save_error"] = None
        if size > 1:  # a SavedModel's functions would exchange rows between ranks: refused, with the fix
            try:
                adam.save(os.path.join(out_dir, f"saved_model_{rank}"))
            except NotImplementedError as err:
                result["save_error"] = str(err)
            # so is a ModelCheckpoint saving the whole model: when fit starts, before any step
            x, y = batch(0)
            x, y = local(x, rank, size), local(y, rank, size)
            del x["small"]
            iterations = int(adam.optimizer.iterations)
            callback = tf.keras.callbacks.ModelCheckpoint(os.path.join(out_dir, f"model_checkpoint_{rank}"))
            try:
                adam.fit(x, y, batch_size=len(y), epochs=1, verbose=0, callbacks=[callback])
            except NotImplementedError as err:
                result["checkpoint_callback_error"] = str(err)
            result["checkpoint_callback_steps"] = int(adam.optimizer.iterations) - iterations
        for tag, pack in (("mixed", False), ("mixed_packed", True)):
            model = build("adagrad", size, mixed=True, pack=pack)
            result[f"{tag}_losses"] = train(model, 0, STEPS, rank, size)
            result[f"{tag}_static_sharded"] = len(htf.horovod.local_variables(model)) if size > 1 else 0
            result[f"{tag}_skipped"] = sorted(s.name for s in model.hybridtf_skipped)
            before = export(model, size)  # save_weights of a model with static shards and dynamic tables
            model.save_weights(os.path.join(out_dir, tag, "ckpt"))
            reloaded = build("adagrad", size, mixed=True, pack=pack)
            reloaded.load_weights(os.path.join(out_dir, tag, "ckpt"))
            after = export(reloaded, size)
            result[f"{tag}_reload_identical"] = all(np.array_equal(before[k], after[k]) for k in before)
        # a layer called on two inputs: on 2 ranks a store of its own serves both calls (one exchange per step)
        shared = build_shared(size)
        result["shared_losses"] = train(shared, 0, STEPS, rank, size)
        result["shared_skipped"] = [s.reason for s in shared.hybridtf_skipped]
        result["adagrad_hvd_first_losses"] = train(build("adagrad_hvd_first", size), 0, STEPS, rank, size)
        plain_optimizer = build("adagrad_plain", size)
        result["adagrad_plain_losses"] = train(plain_optimizer, 0, STEPS, rank, size)
        result["adagrad_plain_dense"] = [float(np.sum(np.abs(w))) for w in plain_optimizer.get_layer(index=-1).weights]
        loop_model, step = custom_loop(size)
        result["loop_losses"] = train(loop_model, 0, STEPS, rank, size, step)
        if size > 1:  # ranks that restore different checkpoints: refused on every rank, naming the fix
            for tag, mixed in (("different_ckpt_mixed", True), ("different_ckpt_dynamic", False)):
                model = build("adagrad", size, mixed=mixed)
                model.save_weights(os.path.join(out_dir, tag, "init", "ckpt"))
                train(model, 0, 1, rank, size)
                model.save_weights(os.path.join(out_dir, tag, "later", "ckpt"))
                try:
                    build("adagrad", size, mixed=mixed).load_weights(
                        os.path.join(out_dir, tag, "later" if rank == 0 else "init", "ckpt")
                    )
                    result[f"{tag}_error"] = None
                except ValueError as err:
                    result[f"{tag}_error"] = str(err)
        if mode == "train":
            save(adam, out_dir, "c1", rank, size)  # the Adam model after STEPS steps
            result["after_c1"] = train(adam, STEPS, 6, rank, size)
    if "restore" in mode:
        result.update(restore(out_dir, sys.argv[3], int(sys.argv[4]), rank, size))
    with open(os.path.join(out_dir, f"{mode}_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

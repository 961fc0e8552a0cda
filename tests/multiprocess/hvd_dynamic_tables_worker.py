"""One process of the Tables-API dynamic-table Horovod tests: trains, checkpoints, writes what it saw.

Run by tests/multiprocess/test_horovod_dynamic_tables.py as one process, then
under ``horovodrun -np 2 -H localhost:2 --gloo``. Every process sees the same
global batches; rank ``r`` of ``n`` trains on rows ``[r * B / n, (r + 1) * B / n)``.
A ``hybridtf.embedding.Tables`` set with a dynamic table (created after
``hvd.init()``: sharded by id over the ranks) is trained

* in a subclassed Keras model through ``htf.keras.optimize`` (``train_on_batch``,
  ``hvd.DistributedOptimizer`` around the hooked Adagrad; ``save_weights`` ->
  ``load_weights``),
* in a custom loop (``hybridtf.function`` step, ``GradientTape`` +
  ``hybridtf.horovod.DistributedGradientTape`` given the model, Adam; the set also holds a static
  table, sharded by rows, whose shards must stay local too), checkpointed with
  ``tf.train.Checkpoint`` (one process: c1; 2 ranks restore c1 and continue),
* in an Estimator model_fn (``hybridtf.horovod.DistributedOptimizer``),
* as two ``Tables`` sets that both hold a table "users" (``average_gradients``, SGD),
* in ``hybridtf.function`` steps with no Horovod tape or optimizer (a static-only set with a plain
  Keras Adagrad, which the step hooks; a static + dynamic set with ``dynamic_optimizer``): hybridtf
  averages the dense gradients and keeps the shards' local.

    python hvd_dynamic_tables_worker.py OUT            # one process: also writes c1
    horovodrun -np 2 ... hvd_dynamic_tables_worker.py OUT   # 2 ranks: also restores OUT/c1
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
import hybridtf.estimator as htf_estimator
from hybridtf._src.distribute import dynamic_exchange

GLOBAL_BATCH, DIM, STEPS = 32, 4, 10
FIELDS = ("ids", "rows", "slots", "counts", "slot_init", "step")
# Small hot tier, a flush every 3 steps after 2 warm-up steps: flushes happen during every run.
TABLE = {"hot_rows": 8, "warmup_steps": 2, "flush_every": 3}
LOSS_KEY = "hvd_dynamic_tables_loss"
STATIC_VOCAB = 40


def batch(step: int):
    """The global batch of ``step``: Zipf-like draws over raw 64-bit ids (negative ones too)."""
    vocab = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, size=100, dtype=np.int64)
    rng = np.random.default_rng(2000 + step)
    p = 1.0 / np.arange(1, vocab.size + 1) ** 1.1
    ids = vocab[rng.choice(vocab.size, size=(GLOBAL_BATCH, 3), p=p / p.sum())]
    x = rng.normal(size=(GLOBAL_BATCH, 2)).astype(np.float32)
    return {"ids": ids, "x": x}, rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)


def local(arrays, rank: int, size: int):
    n = GLOBAL_BATCH // size
    if isinstance(arrays, dict):
        return {k: v[rank * n : (rank + 1) * n] for k, v in arrays.items()}
    return arrays[rank * n : (rank + 1) * n]


def make_tables(with_static: bool = False):
    configs = [htf.embedding.DynamicTableConfig("users", DIM, seed=21, **TABLE)]
    if with_static:  # a static table in the same set: sharded by rows over the ranks
        init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=5)
        configs.append(htf.embedding.TableConfig("items", STATIC_VOCAB, DIM, initializer=init))
    return htf.embedding.Tables(configs)


class TablesModel(tf.keras.Model):
    """A subclassed Keras model whose embeddings come from a ``Tables`` dynamic table (and a static one)."""

    def __init__(self, with_static: bool = False):
        super().__init__()
        self.with_static = with_static
        self.tables = make_tables(with_static)
        self.hidden = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(3))
        self.out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))

    def call(self, inputs, training=None):
        parts = [self.tables.lookup("users", inputs["ids"], "sum", training=bool(training))]
        if self.with_static:
            parts.append(self.tables.lookup("items", tf.math.floormod(inputs["ids"][:, 0], STATIC_VOCAB)))
        return self.out(self.hidden(tf.concat([*parts, inputs["x"]], 1)))


def allreduce_mean(values, size: int, name: str):
    if size == 1:
        return [float(v) for v in values]
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Average, name=name).numpy().tolist()


def export(tables, size: int) -> dict:
    table = tables.dynamic_tables["users"].table
    parts = dynamic_exchange.full_export(table, table.world) if size > 1 else table.export()
    return {k: np.asarray(v) for k, v in zip(FIELDS, parts)}


def optimized_model(rank: int, size: int):
    """A ``TablesModel`` through ``htf.keras.optimize`` (nothing static to pack: its save_weights gathers)."""
    model = TablesModel()
    x, _ = batch(0)
    model(local(x, rank, size))  # built (read-only lookups: nothing inserted)
    return htf.keras.optimize(model)


def keras_fit(rank: int, size: int, out_dir: str) -> dict:
    model = optimized_model(rank, size)
    optimizer = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1))
    if size > 1:
        optimizer = hvdk.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        losses.append(model.train_on_batch(local(x, rank, size), local(y, rank, size)))
    stats = model.tables.dynamic_tables["users"].stats()
    x, y = batch(100)
    predicted = model(local(x, rank, size), training=False)  # inference: a read-only sharded lookup
    evaluation = float(tf.reduce_mean(tf.square(predicted - local(y, rank, size))))
    before = export(model.tables, size)
    model.save_weights(os.path.join(out_dir, f"keras_{size}", "ckpt"))  # every rank calls it, rank 0 writes
    reloaded = optimized_model(rank, size)
    reloaded.load_weights(os.path.join(out_dir, f"keras_{size}", "ckpt"))
    after = export(reloaded.tables, size)
    return {
        "keras_reload_identical": all(np.array_equal(before[k], after[k]) for k in before),
        "keras_losses": allreduce_mean(losses, size, "keras_losses"),
        "keras_eval": allreduce_mean([evaluation], size, "keras_eval")[0],
        "keras_flushes": stats["flushes"],
        "keras_local_size": stats["size"],
        "keras_sharded_tables": len(dynamic_exchange.sharded_tables(model)),
    }


def custom_loop(rank: int, size: int, out_dir: str) -> dict:
    # the set also holds a static table: DistributedGradientTape(tape, model) must keep its shards local too
    model = TablesModel(with_static=True)
    optimizer = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adam(0.01))

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        if size > 1:
            tape = htf.horovod.DistributedGradientTape(tape, model)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def train(first, steps):
        losses = []
        for s in range(first, first + steps):
            x, y = batch(s)
            losses.append(float(step(local(x, rank, size), local(y, rank, size))))
        return allreduce_mean(losses, size, f"loop_losses_{first}")

    result = {"loop_losses": train(0, STEPS)}
    checkpoint = tf.train.Checkpoint(tables=model.tables)
    if size == 1:  # c1: the one process's tables after STEPS steps
        checkpoint.write(os.path.join(out_dir, "c1", "ckpt"))
        np.savez(os.path.join(out_dir, "c1_1.npz"), **export(model.tables, size))
    else:  # 1 -> 2 ranks: restore the one process's c1 into fresh tables, gathered they are c1 bit for bit
        restored = make_tables(with_static=True)
        tf.train.Checkpoint(tables=restored).read(os.path.join(out_dir, "c1", "ckpt")).assert_consumed()
        if rank == 0:
            np.savez(os.path.join(out_dir, "restored_2.npz"), **export(restored, size))
        else:
            export(restored, size)  # a collective: every rank gathers
        result["restored_local_size"] = restored.dynamic_tables["users"].stats()["size"]
        # every rank writes (a collective gather of the whole table), each to its own path
        checkpoint.write(os.path.join(out_dir, f"c2_rank{rank}", "ckpt"))
    return result


class StaticTablesModel(tf.keras.Model):
    """A ``Tables`` set with a static table only (sharded by rows over the ranks) and a dense head."""

    def __init__(self):
        super().__init__()
        init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=5)
        self.tables = htf.embedding.Tables([htf.embedding.TableConfig("items", STATIC_VOCAB, DIM, initializer=init)])
        self.out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))

    def call(self, inputs, training=None):
        ids = tf.math.floormod(inputs["ids"], STATIC_VOCAB)
        return self.out(tf.concat([self.tables.lookup("items", ids, "mean"), inputs["x"]], 1))


def _untaped_run(model, optimizer, rank: int, size: int, name: str) -> dict:
    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = []
    for s in range(STEPS):
        x, y = batch(s)
        losses.append(float(step(local(x, rank, size), local(y, rank, size))))
    return {f"{name}_losses": allreduce_mean(losses, size, name), f"{name}_head": model.out.kernel.numpy().tolist()}


def untaped(rank: int, size: int) -> dict:
    """Custom steps that average nothing themselves: hybridtf averages (before, each rank trained its own head)."""
    result = _untaped_run(StaticTablesModel(), tf.keras.optimizers.Adagrad(0.1), rank, size, "untaped_static")
    mixed = htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1))
    result.update(_untaped_run(TablesModel(with_static=True), mixed, rank, size, "untaped_mixed"))
    return result


def twin_sets(rank: int, size: int) -> dict:
    """Two ``Tables`` sets that both hold a dynamic table "users", looked up in one step: no collective clash."""
    sets = [
        htf.embedding.Tables([htf.embedding.DynamicTableConfig("users", DIM, seed=s, **TABLE)], name=f"set{s}")
        for s in (31, 32)
    ]
    optimizer = htf.keras.dynamic_optimizer(tf.keras.optimizers.SGD(0.5))

    @tf.function
    def step(ids, y):
        with tf.GradientTape() as tape:
            emb = sets[0].lookup("users", ids, "sum") * sets[1].lookup("users", ids, "mean")
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, 1, keepdims=True) - y))
        variables = [v for t in sets for v in t.trainable_variables]
        grads = tape.gradient(loss, variables)
        if size > 1:
            grads = htf.horovod.average_gradients(grads, variables, *sets)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    losses = []
    for s in range(STEPS):
        x, y = batch(s)
        losses.append(float(step(local(x, rank, size)["ids"], local(y, rank, size))))
    return {"twin_losses": allreduce_mean(losses, size, "twin_losses")}


def model_fn(features, labels, mode):
    train = mode == tf.estimator.ModeKeys.TRAIN
    tables = make_tables()
    emb = tables.lookup("users", features["ids"], "sum", training=train)
    h = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=7))(
        tf.concat([emb, features["x"]], axis=1)
    )
    pred = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=8))(h)
    loss = tf.reduce_mean(tf.square(pred - labels))
    if not train:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    optimizer = htf.keras.dynamic_optimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    if hvd.size() > 1:
        optimizer = htf.horovod.DistributedOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class LossHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def input_fn(first: int, steps: int, rank: int, size: int):
    xs, ids, ys = [], [], []
    for s in range(first, first + steps):
        x, y = batch(s)
        x, y = local(x, rank, size), local(y, rank, size)
        ids.append(x["ids"])
        xs.append(x["x"])
        ys.append(y)
    features = {"ids": np.concatenate(ids), "x": np.concatenate(xs)}
    return tf.data.Dataset.from_tensor_slices((features, np.concatenate(ys))).batch(GLOBAL_BATCH // size)


def estimator(rank: int, size: int, out_dir: str) -> dict:
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    model_dir = os.path.join(out_dir, f"est_{size}_{rank}")  # every rank saves (the table is gathered)
    est = tf.estimator.Estimator(htf_estimator.model_fn(model_fn), model_dir=model_dir, config=config)
    hook = LossHook()
    est.train(lambda: input_fn(0, STEPS, rank, size), steps=STEPS, hooks=[hook])
    evaluation = est.evaluate(lambda: input_fn(50, 2, rank, size), steps=2)["loss"]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    table = {f: reader.get_tensor(f"hybridtf_dynamic/users/{f}") for f in FIELDS}
    np.savez(os.path.join(out_dir, f"est_table_{size}_{rank}.npz"), **table)
    return {
        "est_losses": allreduce_mean(hook.losses, size, "est_losses"),
        "est_eval": allreduce_mean([evaluation], size, "est_eval")[0],
    }


def main():
    out_dir = sys.argv[1]
    early = make_tables()  # built before hvd.init(): not sharded
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result = {"rank": rank, "size": size, "early_error": None}
    try:
        early.lookup("users", tf.constant([1, 2], tf.int64), training=True)
    except ValueError as err:
        result["early_error"] = str(err)
    result.update(keras_fit(rank, size, out_dir))
    result.update(custom_loop(rank, size, out_dir))
    result.update(estimator(rank, size, out_dir))
    result.update(twin_sets(rank, size))
    result.update(untaped(rank, size))
    with open(os.path.join(out_dir, f"tables_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""One process of the rank-fault tests: a rank diverges from the others, every rank must end.

Run by tests/multiprocess/test_rank_faults.py under
``horovodrun -np 2 -H localhost:2 --gloo``::

    python tests/multiprocess/hvd_fault_worker.py SCENARIO OUT_DIR

Scenarios (rank 1 always has fewer batches, or fails):

* ``uneven_save``: rank 0 fits 6 batches, rank 1 fits 3; both call ``save_weights``;
* ``uneven_evaluate`` / ``uneven_predict``: the same, then ``evaluate`` / ``predict``;
* ``uneven_exit``: the same in a custom loop (``htf.function`` steps under
  ``htf.horovod.collective_phase``), then the script ends;
* ``uneven_epochs``: rank 0 fits 6 batches per epoch, rank 1 3, for 3 epochs: rank 1 waits at its
  first epoch's end while rank 0 is in its fourth step;
* ``raise`` / ``kill``: rank 1 raises in a callback after its third step / kills itself (SIGKILL);
* ``interleaved``: both fit 6 batches with 2 micro-batches and 2 K-interleaving groups; rank 1's
  fourth step fails inside the graph, in its second micro-batch's loss (a NaN label meets
  ``tf.debugging.assert_all_finite``), after that micro-batch's lookups and exchange;
* ``estimator_uneven``: a wrapped Estimator model_fn with sharded tables, ``train`` until the input
  ends: rank 0's input has 6 batches, rank 1's 3; rank 1 goes to its final checkpoint (a gather of
  the shards) while rank 0 waits in its next step (both armed: the gather, and the step by the wrapped
  model_fn's ``StepWatchdogHook``);
* ``estimator_evaluate``: a wrapped Estimator model_fn with sharded tables; both ranks ``train`` 3
  batches, then rank 1 ``evaluate``s while rank 0 ``train``s 3 more (both steps armed);
* ``estimator_restore``: a wrapped Estimator model_fn with sharded tables; both ranks ``train`` 2
  batches (and save), then train on, rank 0 from its checkpoint and rank 1 from an empty model_dir:
  both must refuse before any step (the checkpoints the ranks restore are compared);
* ``even``: both fit 6 batches and save (must succeed).

Each rank prints ``hybridtf-fault-test: rank R diverges at T`` (``time.time()``)
when it leaves the common path, and ``hybridtf-fault-test: rank R done`` when
its script completes without an error.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models

BATCH = 16
FIELDS = [ctr_data.FieldSpec("a", 100, 4), ctr_data.FieldSpec("b", 200, 4)]


class FailAfter(tf.keras.callbacks.Callback):
    def __init__(self, step, kill):
        super().__init__()
        self.step, self.kill = step, kill

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            print(f"hybridtf-fault-test: rank {hvd.rank()} diverges at {time.time():.3f}", flush=True)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"hybridtf-fault-test: rank {hvd.rank()} fails on purpose after step {self.step}")


class DivergesAfter(tf.keras.callbacks.Callback):
    """Notes the time the step that will fail inside the graph starts."""

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == 3:
            print(f"hybridtf-fault-test: rank {hvd.rank()} diverges at {time.time():.3f}", flush=True)


def checked_loss(y_true, y_pred):
    y_true = tf.debugging.assert_all_finite(y_true, "hybridtf-fault-test: a NaN label in an interleaved step")
    return tf.keras.losses.binary_crossentropy(y_true, y_pred)


def dataset(num_batches, seed, nan_row=None):
    batches = list(ctr_data.generate_batches(FIELDS, 2, BATCH, num_batches, seed=seed))
    xs = {k: np.concatenate([x[k] for x, _ in batches]) for k in batches[0][0]}
    ys = np.concatenate([y for _, y in batches]).astype(np.float32)
    if nan_row is not None:
        ys[nan_row] = np.nan
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH)


def custom_loop(model, data):
    optimizer = tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @htf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = htf.horovod.DistributedGradientTape(tape, model)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for i, (x, y) in enumerate(data):
        if i == 0:  # the first call traces the step (slow on a loaded machine): unbounded, on every rank
            step(x, y)
            continue
        with htf.horovod.collective_phase("train step"):
            step(x, y)


def estimator_model_fn(features, labels, mode):
    init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=1)
    embedded = [
        tf.keras.layers.Embedding(f.vocab, f.dim, embeddings_initializer=init)(features[f.name]) for f in FIELDS
    ]
    logit = tf.keras.layers.Dense(1)(tf.concat([tf.reshape(e, [-1, 4]) for e in embedded], 1))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.reshape(labels, [-1, 1]), logits=logit))
    optimizer = htf.horovod.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class DivergesAtTheEnd(tf.compat.v1.train.SessionRunHook):
    """Notes the time rank 1 ran its last batch (its input then ends and it saves its final checkpoint)."""

    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1
        if hvd.rank() == 1 and self.steps == 3:
            print(f"hybridtf-fault-test: rank 1 diverges at {time.time():.3f}", flush=True)


def estimator_uneven(out, rank):
    def input_fn():
        return dataset(6 if rank == 0 else 3, seed=10 + rank).map(lambda x, y: ({k: x[k] for k in ("a", "b")}, y))

    config = tf.estimator.RunConfig(save_checkpoints_steps=2, save_summary_steps=None, log_step_count_steps=None)
    model_dir = os.path.join(out, f"estimator_{rank}")
    est = tf.estimator.Estimator(htf.estimator.model_fn(estimator_model_fn), model_dir=model_dir, config=config)
    est.train(input_fn, hooks=[DivergesAtTheEnd()])


def estimator_evaluate(out, rank):
    """Both train 3 batches (and save); then rank 1 evaluates while rank 0 trains 3 more."""

    def input_fn(batches, seed):
        return lambda: dataset(batches, seed=seed).map(lambda x, y: ({k: x[k] for k in ("a", "b")}, y))

    config = tf.estimator.RunConfig(save_checkpoints_steps=100, save_summary_steps=None, log_step_count_steps=None)
    model_dir = os.path.join(out, f"estimator_evaluate_{rank}")
    est = tf.estimator.Estimator(htf.estimator.model_fn(estimator_model_fn), model_dir=model_dir, config=config)
    est.train(input_fn(3, 10 + rank))
    print(f"hybridtf-fault-test: rank {rank} diverges at {time.time():.3f}", flush=True)
    if rank == 1:
        est.evaluate(input_fn(3, 99))
    else:
        est.train(input_fn(3, 20))


def estimator_restore(out, rank):
    def input_fn(batches, seed):
        return lambda: dataset(batches, seed=seed).map(lambda x, y: ({k: x[k] for k in ("a", "b")}, y))

    def estimator(model_dir):
        config = tf.estimator.RunConfig(save_checkpoints_steps=100, save_summary_steps=None, log_step_count_steps=None)
        return tf.estimator.Estimator(
            htf.estimator.model_fn(estimator_model_fn), model_dir=os.path.join(out, model_dir), config=config
        )

    estimator(f"estimator_restore_{rank}").train(input_fn(2, 10 + rank))
    print(f"hybridtf-fault-test: rank {rank} diverges at {time.time():.3f}", flush=True)
    estimator(f"estimator_restore_{rank}" if rank == 0 else "estimator_restore_empty").train(input_fn(2, 20))


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    hvd.init()
    rank = hvd.rank()
    hvd.allreduce(tf.constant(0), name="start")  # ranks start up at different speeds: align before timing anything
    if scenario.startswith("estimator_"):
        scenarios = {"estimator_uneven": estimator_uneven, "estimator_evaluate": estimator_evaluate}
        scenarios["estimator_restore"] = estimator_restore
        scenarios[scenario](out, rank)
        print(f"hybridtf-fault-test: rank {rank} done", flush=True)
        return
    model = ctr_models.wide_and_deep(FIELDS, 2, hidden=(8,), seed=3)
    if scenario == "interleaved":
        model = htf.keras.optimize(model, micro_batches=2, interleave_from="embedding", interleave_groups=2)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss=checked_loss)
    else:
        model = htf.keras.optimize(model)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    batches = 6 if rank == 0 or scenario in ("even", "interleaved") else 3
    callbacks = [FailAfter(3, kill=scenario == "kill")] if scenario in ("raise", "kill") and rank == 1 else []
    if scenario == "interleaved":  # rank 1: a NaN label in step 4's second micro-batch
        nan_row = 3 * BATCH + BATCH * 3 // 4 if rank == 1 else None
        model.fit(dataset(batches, seed=10 + rank, nan_row=nan_row), epochs=1, verbose=0, callbacks=[DivergesAfter()])
    elif scenario == "uneven_exit":
        custom_loop(model, dataset(batches, seed=10 + rank))
    elif scenario == "uneven_epochs":
        model.fit(dataset(batches, seed=10 + rank), epochs=3, verbose=0)
    else:
        model.fit(dataset(batches, seed=10 + rank), epochs=1, verbose=0, callbacks=callbacks)
    start = time.monotonic()
    print(f"hybridtf-fault-test: rank {rank} diverges at {time.time():.3f}", flush=True)
    if scenario in ("uneven_save", "even"):
        model.save_weights(os.path.join(out, f"ckpt_{scenario}", "ckpt"))
    elif scenario == "uneven_evaluate":
        model.evaluate(dataset(2, seed=99), verbose=0)
    elif scenario == "uneven_predict":
        model.predict(dataset(2, seed=99), verbose=0)
    print(f"hybridtf-fault-test: rank {rank} done after {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException as err:
        rank = os.environ.get("HOROVOD_RANK")
        # the error's type and message in the same flushed line: horovodrun may terminate this rank before
        # Python prints the traceback
        print(
            f"hybridtf-fault-test: rank {rank} ends at {time.time():.3f} with {type(err).__name__}: {err}", flush=True
        )
        raise

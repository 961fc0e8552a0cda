"""One process of the Keras checkpoint-callback tests under ``horovodrun -np 2 -H localhost:2 --gloo``.

Run by tests/multiprocess/test_horovod_checkpoints.py::

    python tests/multiprocess/hvd_checkpoint_worker.py OUT_DIR

Every rank runs the same ``fit`` calls with the same callbacks (Horovod's idiom for hybridtf models) and
writes what happened to ``OUT_DIR/checkpoints_<rank>.json``:

* ``replicated``: a model whose packed tables are all replicated (``replicate_below_rows``), with a
  ``ModelCheckpoint`` saving the whole model (``.keras``) and one saving the weights, one path each;
* ``per_rank_path``: a model with sharded tables and a ``ModelCheckpoint(f".../rank{rank}/w",
  save_weights_only=True)``;
* ``backup``: ``BackupAndRestore`` with one ``backup_dir`` per rank: a run fails after epoch 1 and the
  next resumes (against an uninterrupted run); then a run fails, rank 1's backup is removed, and the
  next run starts from different backups on the ranks;
* ``best_every_batch``: sharded tables, ``MetricAverageCallback`` and a ``ModelCheckpoint(save_best_only=True,
  save_freq=1)``, each rank on its own data (different batch losses): the ranks decide on their mean. Before,
  they decided on their own batch logs, one saved (a collective) while the other trained on, and both ended
  after the collective timeout (found by a probe);
* ``sharded_view_edits``: a sharded table's ``layer.embeddings`` read by index and written by ``scatter_*``
  and ``assign_add`` on every rank (a sliced write is refused with the fix).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import zipfile

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models

BATCH = 16
EPOCHS = 3
FIELDS = [ctr_data.FieldSpec("a", 100, 4), ctr_data.FieldSpec("b", 200, 4)]


class Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record):
        self.texts.append(record.getMessage())


class FailAfterEpoch(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("hybridtf-checkpoint-test: fails on purpose after epoch 1")


def dataset(rank):
    batches = list(ctr_data.generate_batches(FIELDS, 2, BATCH, 3, seed=10 + rank))
    xs = {k: np.concatenate([x[k] for x, _ in batches]) for k in batches[0][0]}
    ys = np.concatenate([y for _, y in batches]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH)


def probe_batch():
    x, _ = next(iter(ctr_data.generate_batches(FIELDS, 2, 32, 1, seed=99)))
    return ctr_data.to_tensors(x)


def model(**options):
    built = htf.keras.optimize(ctr_models.wide_and_deep(FIELDS, 2, hidden=(8,), seed=3), **options)
    built.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return built


def barrier(name):
    hvd.allreduce(tf.constant(0), name=name)


def replicated(out, rank, messages):
    path = os.path.join(out, "replicated")
    trained = model(replicate_below_rows=10**6)
    callbacks = [
        tf.keras.callbacks.ModelCheckpoint(os.path.join(path, "model.keras"), save_weights_only=False),
        tf.keras.callbacks.ModelCheckpoint(os.path.join(path, "weights", "ckpt"), save_weights_only=True),
    ]
    result = {"replicated_error": None}
    try:
        trained.fit(dataset(rank), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    except Exception as err:  # recorded for the test's message
        result["replicated_error"] = f"{type(err).__name__}: {err}"
        return result
    barrier("replicated_saved")
    reloaded = model(replicate_below_rows=10**6)
    reloaded.load_weights(os.path.join(path, "weights", "ckpt"))  # every rank: the same checkpoint
    x = probe_batch()
    result["replicated_reload_diff"] = float(np.max(np.abs(reloaded.predict(x, verbose=0) - trained.predict(x))))
    result["replicated_keras_file"] = zipfile.is_zipfile(os.path.join(path, "model.keras"))
    result["replicated_leftovers"] = sorted(n for n in os.listdir(path) if "htf-" in n)
    result["replicated_told"] = [t for t in messages.texts if "writes nothing" in t]
    return result


def per_rank_path(out, rank):
    trained = model()
    callback = tf.keras.callbacks.ModelCheckpoint(
        os.path.join(out, "per_rank", f"rank{rank}", "w"), save_weights_only=True
    )
    start = time.monotonic()
    try:
        trained.fit(dataset(rank), epochs=1, verbose=0, callbacks=[callback])
        error = None
    except ValueError as err:
        error = str(err)
    return {"per_rank_error": error, "per_rank_seconds": time.monotonic() - start}


def fail_after_a_backup(directory, rank):
    """A fit that backs up every epoch and fails after epoch 1 (of ``EPOCHS``) on every rank."""
    try:
        model().fit(
            dataset(rank),
            epochs=EPOCHS,
            verbose=0,
            callbacks=[tf.keras.callbacks.BackupAndRestore(directory), FailAfterEpoch()],
        )
    except RuntimeError:
        return
    raise AssertionError("the fit did not fail")


def backup(out, rank):
    x = probe_batch()
    result = {}
    whole = model()
    whole.fit(dataset(rank), epochs=EPOCHS, verbose=0)
    result["uninterrupted"] = whole.predict(x, verbose=0).tolist()

    directory = os.path.join(out, "backup", f"rank{rank}")
    fail_after_a_backup(directory, rank)
    resumed = model()
    history = resumed.fit(
        dataset(rank), epochs=EPOCHS, verbose=0, callbacks=[tf.keras.callbacks.BackupAndRestore(directory)]
    )
    result["resumed_epochs"] = len(history.history["loss"])
    result["resumed"] = resumed.predict(x, verbose=0).tolist()

    directory = os.path.join(out, "mismatch", f"rank{rank}")
    fail_after_a_backup(directory, rank)
    barrier("mismatch_failed")
    if rank == 1:
        shutil.rmtree(directory)  # as after a run on another number of ranks: no backup here
    barrier("mismatch_removed")
    start = time.monotonic()
    try:
        model().fit(dataset(rank), epochs=EPOCHS, verbose=0, callbacks=[tf.keras.callbacks.BackupAndRestore(directory)])
        result["mismatch_error"] = None
    except ValueError as err:
        result["mismatch_error"] = str(err)
    result["mismatch_seconds"] = time.monotonic() - start
    return result


class BatchLosses(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def best_every_batch(out, rank):
    import horovod.tensorflow.keras as hvd_keras

    own = BatchLosses()
    best = tf.keras.callbacks.ModelCheckpoint(
        os.path.join(out, "best", "w"), monitor="loss", save_best_only=True, save_weights_only=True, save_freq=1
    )
    start = time.monotonic()
    try:
        model().fit(
            dataset(rank), epochs=2, verbose=0, callbacks=[hvd_keras.callbacks.MetricAverageCallback(), own, best]
        )
        error = None
    except Exception as err:  # recorded for the test's message
        error = f"{type(err).__name__}: {err}"
    return {
        "best_error": error,
        "best_seconds": time.monotonic() - start,
        "best_own_losses": own.losses,
        "best_value": float(best.best),
    }


def sharded_view_edits(rank):
    view = model().get_layer("emb_b").embeddings  # 200 rows over 2 ranks
    before = view.numpy()
    row = view[7].numpy()
    view.scatter_update(tf.IndexedSlices(tf.ones((2, 4)), tf.constant([0, 199])))
    view.scatter_add(tf.IndexedSlices(tf.fill((2, 4), 2.0), tf.constant([0, 5])))
    view.scatter_sub(tf.IndexedSlices(tf.ones((1, 4)), tf.constant([150])))
    view.assign_add(tf.fill((200, 4), 0.5))
    try:
        view[3].assign(tf.zeros(4))
        refused = None
    except NotImplementedError as err:
        refused = str(err)
    return {
        "view_before": before.tolist(),
        "view_row7": row.tolist(),
        "view_after": view.numpy().tolist(),
        "view_sliced_write": refused,
    }


def main():
    out = sys.argv[1]
    hvd.init()
    rank = hvd.rank()
    messages = Messages()
    logging.getLogger("hybridtf").addHandler(messages)
    result = {"rank": rank}
    result.update(replicated(out, rank, messages))
    result.update(per_rank_path(out, rank))
    result.update(backup(out, rank))
    result.update(best_every_batch(out, rank))
    result.update(sharded_view_edits(rank))
    with open(os.path.join(out, f"checkpoints_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""Keras callbacks given to an optimized model's ``fit``, adapted to its packed tables.

* ``ModelCheckpoint`` to a legacy ``.h5`` path: refused when ``fit`` starts
  (``keras_notices.refuse_legacy_hdf5``), not after the first epoch's training;
  so is one saving the whole model (``save_weights_only=False``) of a model
  whose tables are sharded over Horovod ranks (``model.save`` refuses it;
  ``keras_unpacked.refuse_sharded_model_saves``, which both model classes call).
* ``TensorBoard(histogram_freq=N)``: Keras logs the histograms of each
  top-level layer's ``weights``; a packed layer holds none (its rows live in
  the packed variable), so each packed table's rows are logged as well, under
  the plain model's tag (``emb_user/embeddings_0/histogram``).
* under Horovod with sharded tables, ``ModelCheckpoint`` / ``BackupAndRestore``
  on some ranks only (each save is a collective): refused when ``fit`` starts,
  after one allgather (``keras_unpacked.check_ranks_save_alike``), not after the collective
  timeout at the first save. A ``ModelCheckpoint(save_best_only=True)`` saving every N batches decides
  on its monitored value averaged over the ranks (``keras_unpacked.average_best_batch_metric``).
* ``EarlyStopping(restore_best_weights=True)``: the dynamic tables are kept
  and restored with the weights (``keras_best_weights``).
* under Horovod, ``BackupAndRestore``: before it restores, the ranks compare
  which backup each found (its checkpoint and saved epoch, or none), and after
  it their replicated values (one allgather of a CRC-32 per variable,
  ``agreement.check_model_restored``), so ranks that found different backups
  (one of another number of ranks, a missing directory) raise naming the fix
  instead of meeting in different collectives.
* under Horovod with rank-local tables, each epoch's end but the last is a collective
  (``keras_unpacked.with_epoch_agreement``, which both model classes call): ranks whose data
  gives different numbers of batches per epoch met each other's next epoch's steps, silently,
  until one reached something else; now the rank that ends its epoch first waits there, and the
  watchdog names both ranks' places.
"""

from __future__ import annotations

import os

import tensorflow as tf

from hybridtf._src.capture.keras_capture import is_captured
from hybridtf._src.distribute import agreement
from hybridtf._src.distribute.world import current_world
from hybridtf._src.integrations import keras_notices
from hybridtf._src.integrations.keras_best_weights import keep_best_tables
from hybridtf._src.integrations.keras_unpacked import (
    average_best_batch_metric,
    check_ranks_save_alike,
    rank_local_variables,
    refuse_sharded_model_saves,
)


def adapt_callbacks(model, callbacks) -> None:
    """Checks and adapts ``fit``'s callbacks for the optimized ``model`` (see the module docstring)."""
    refuse_sharded_model_saves(model, callbacks)
    check_ranks_save_alike(model, callbacks)
    average_best_batch_metric(model, callbacks)
    for callback in callbacks or ():
        if isinstance(callback, tf.keras.callbacks.ModelCheckpoint):
            keras_notices.refuse_legacy_hdf5(callback.filepath, None)
        if isinstance(callback, tf.keras.callbacks.TensorBoard) and callback.histogram_freq:
            _log_packed_tables_too(callback, model)
        if isinstance(callback, tf.keras.callbacks.BackupAndRestore):
            _check_ranks_restored_alike(callback, model)
        keep_best_tables(callback, model)


_BACKUP_FIX = (
    "BackupAndRestore resumes each rank from its own backup_dir on the number of ranks that wrote them; these "
    "ranks found different backups (one written by another number of ranks, or none on some rank). To continue on "
    "another number of ranks, load a save_weights / ModelCheckpoint (save_weights_only=True) checkpoint with "
    "load_weights, which restores into any number of ranks; to start afresh, remove the backup directories."
)


def _check_ranks_restored_alike(callback, model) -> None:
    """Under Horovod, wraps ``callback``'s (a ``BackupAndRestore``) ``on_train_begin``: before its restore the
    ranks compare which backup each found (restoring sharded tables is a collective: ranks restoring and ranks
    starting afresh would meet in different collectives), after it their replicated values."""
    world = current_world()
    if not world.distributed or getattr(callback, "_htf_restore_checked", None) is model:
        return
    begin = type(callback).on_train_begin

    def on_train_begin(logs=None):
        if callback.model is not model:
            return begin(callback, logs)
        what = f"BackupAndRestore(backup_dir={callback.backup_dir!r}) of model {model.name!r}"
        agreement.check_same_settings(world, {"the backup": _backup_found(callback.backup_dir)}, what, fix=_BACKUP_FIX)
        begin(callback, logs)
        agreement.check_model_restored(model, world, rank_local_variables(model), "BackupAndRestore", _BACKUP_FIX)
        return None

    callback.on_train_begin = on_train_begin
    callback._htf_restore_checked = model


def _backup_found(backup_dir) -> str:
    """The backup ``BackupAndRestore`` would restore from ``backup_dir`` (Keras keeps it in ``chief/``): its
    checkpoint's name and saved epoch and batch, or ``"none"``."""
    latest = tf.train.latest_checkpoint(os.path.join(os.fspath(backup_dir), "chief"))
    if latest is None:
        return "none"
    try:
        reader = tf.train.load_checkpoint(latest)
        saved = {
            key.split("/")[0]: int(reader.get_tensor(key))
            for key in reader.get_variable_to_shape_map()
            if key.split("/")[0] in ("ckpt_saved_epoch", "ckpt_saved_batch")
        }
    except (tf.errors.OpError, ValueError) as err:  # unreadable: Keras's restore will say so
        return f"{os.path.basename(latest)} (unreadable: {type(err).__name__})"
    return f"{os.path.basename(latest)} ({', '.join(f'{k}={v}' for k, v in sorted(saved.items()))})"


def _log_packed_tables_too(callback, model) -> None:
    if getattr(callback, "_htf_packed_histograms", None) is model:
        return
    log_weights = type(callback)._log_weights

    def log_with_tables(epoch):
        log_weights(callback, epoch)
        if callback.model is not model:
            return
        with callback._train_writer.as_default(), tf.summary.record_if(True):
            for name, rows in packed_table_rows(model):
                tf.summary.histogram(f"{name}/embeddings_0/histogram", rows, step=epoch)
        callback._train_writer.flush()

    callback._log_weights = log_with_tables
    callback._htf_packed_histograms = model


def packed_table_rows(model):
    """``(layer name, rows)`` of each packed table of ``model``'s top-level layers (nested ones included)."""
    for top in model.layers:
        for layer in top._flatten_layers(include_self=True):
            if is_captured(layer) and not layer.weights:
                rows = layer.get_weights()
                if rows:
                    yield layer.name, rows[0]


__all__ = ["adapt_callbacks", "packed_table_rows"]

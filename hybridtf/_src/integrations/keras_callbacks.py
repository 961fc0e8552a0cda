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
  timeout at the first save.
* ``EarlyStopping(restore_best_weights=True)``: the dynamic tables are kept
  and restored with the weights (``keras_best_weights``).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.capture.keras_capture import is_captured
from hybridtf._src.integrations import keras_notices
from hybridtf._src.integrations.keras_best_weights import keep_best_tables
from hybridtf._src.integrations.keras_unpacked import check_ranks_save_alike, refuse_sharded_model_saves


def adapt_callbacks(model, callbacks) -> None:
    """Checks and adapts ``fit``'s callbacks for the optimized ``model`` (see the module docstring)."""
    refuse_sharded_model_saves(model, callbacks)
    check_ranks_save_alike(model, callbacks)
    for callback in callbacks or ():
        if isinstance(callback, tf.keras.callbacks.ModelCheckpoint):
            keras_notices.refuse_legacy_hdf5(callback.filepath, None)
        if isinstance(callback, tf.keras.callbacks.TensorBoard) and callback.histogram_freq:
            _log_packed_tables_too(callback, model)
        keep_best_tables(callback, model)


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

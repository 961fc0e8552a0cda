"""``EarlyStopping(restore_best_weights=True)`` of an optimized model restores its dynamic tables too.

Keras keeps the best epoch's weights as ``model.get_weights()`` and puts them back with
``model.set_weights``. A dynamic (HybridHash) table is no variable: its rows, optimizer slots and
counts live in the table, and the layer's only weight is the step's buffer of distinct rows. So
the best epoch's rows were never kept, and the restore left every dynamic table at its last
epoch's rows, silently.

``keep_best_tables(callback, model)`` extends one such callback: whenever it takes the model's
weights (a new best epoch, or its first epoch), each dynamic table of the model (a packed store
once) is exported (ids, rows, slots, counts, in host memory, this rank's part under Horovod), and
when it restores the weights, the tables are imported back. The tables come back whole: rows
with their optimizer slots and counts (Keras restores the weights only; its optimizer's slots
stay at the last epoch's).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.caching.metrics import dynamic_layers


def _tables(model) -> list:
    """Each dynamic table of ``model`` once (a packed store's members share it)."""
    tables = {}
    for layer in dynamic_layers(model):
        table = getattr(layer.table, "store", layer.table)  # a packed member's view: its store
        if hasattr(table, "export_with_members"):
            tables.setdefault(id(table), table)
    return list(tables.values())


def keep_best_tables(callback, model) -> None:
    """Makes ``callback`` (an EarlyStopping restoring best weights) keep and restore ``model``'s tables."""
    if not isinstance(callback, tf.keras.callbacks.EarlyStopping) or not callback.restore_best_weights:
        return
    if getattr(callback, "_htf_best_tables_of", None) is model:
        return
    on_epoch_end = type(callback).on_epoch_end
    kept: list = []

    def on_epoch_end_with_tables(epoch, logs=None):
        before = callback.best_weights
        on_epoch_end(callback, epoch, logs)
        if callback.model is not model:
            return
        if callback.best_weights is not before and callback.best_weights is not None:
            kept[:] = [(table, table.export_with_members()) for table in _tables(model)]
        elif callback.stopped_epoch == epoch and epoch > 0 and callback.best_weights is not None and kept:
            for table, (ids, rows, slots, counts, slot_init, step, members) in kept:
                table.import_(ids, rows, slots, counts, slot_init, step, members=members)

    callback.on_epoch_end = on_epoch_end_with_tables
    callback._htf_best_tables_of = model


__all__ = ["keep_best_tables"]

"""Rows of packed tables that got no gradient stay as they were through the optimizer's update.

Keras skips a variable without gradient. A packed variable has a gradient as
soon as one of its tables has one, and an update over the whole variable
(weight decay, Keras's FTRL, moments decaying everywhere) would change the
others too: a table whose lookups do not reach the loss (a head compiled with
``loss=None``, a lookup under ``tf.stop_gradient``) was decayed or zeroed. The
tables without gradient in the step being traced come from
``run.gradient_arrivals``; their rows of the packed variable and of each of its
optimizer slots are read before the update and written back after it, so they
end the step exactly as in the plain model. Regularized tables always have a
gradient in the plain model (their penalty's), so they are never kept.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from hybridtf._src.run import gradient_arrivals


def keep_rows_without_gradient(optimizer, grads_and_vars) -> Callable[[], None] | None:
    """Reads the rows to keep before ``optimizer``'s update; returns the function that writes them back after it
    (None when every member of every packed variable with a gradient got one, or when that is unknown)."""
    storage = optimizer._htf_storage
    if storage is None or tf.executing_eagerly():
        return None
    regularized = set(storage.regularizers)
    keeps = []
    for grad, variable in grads_and_vars:
        views = optimizer._htf_members.get(id(variable))
        if grad is None or not views or len(views) < 2:
            continue
        without = set(gradient_arrivals.tables_without_gradient([v.table for v in views])) - regularized
        if not without:
            continue
        ranges = [np.arange(*v.local_rows(), dtype=np.int64) for v in views if v.table in without]
        keeps.append((variable, tf.constant(np.concatenate(ranges))))
    if not keeps:
        return None
    with tf.init_scope():  # the slots exist before they are read (Keras builds over the same variables)
        optimizer.build([v for _, v in grads_and_vars])
    slot_of = optimizer._htf_slot_of
    saved = []
    with tf.name_scope("hybridtf_kept_rows"):
        for variable, rows in keeps:
            targets = [variable] + [s for s in optimizer.variables if slot_of.get(id(s), (None,))[0] is variable]
            saved.extend((target, rows, target.sparse_read(rows)) for target in targets)

    def restore() -> None:
        with tf.name_scope("hybridtf_kept_rows"):
            for target, rows, values in saved:
                target.scatter_update(tf.IndexedSlices(values, rows))

    return restore

"""The step that finds the end of the data: what plain Keras Adam changes there, the fused update changes too.

When ``fit`` reads a dataset of unknown length (a ``TFRecordDataset``, a
``filter``, a Python generator) Keras learns where an epoch ends by running one
more step, which fails in ``IteratorGetNext`` (``OutOfRangeError``). TensorFlow
still runs the ops of that step that do not depend on the data. Keras Adam's
update of an ``IndexedSlices`` gradient starts with ``m.assign_add(-m * (1 -
beta_1))`` and ``v.assign_add(-v * (1 - beta_2))`` over the whole table, which
need no data: in the plain model every embedding table's moments decay once
more in that step (and ``iterations`` counts it), while nothing else changes.
hybridtf's fused Adam update is one op that needs the gradient, so it does not
run at all, and from the next epoch on the two models would train apart.

``note_fused_adam`` records, while the training step is traced, which packed
variables the fused Adam updates and which of their rows had a gradient and no
regularizer (the tables the plain model would decay; each rank's own rows of
them when sharded); ``note_dynamic_adam`` the HybridHash stores whose Adam
update decays every stored row. ``EndOfDataMixin``, a base of both optimized
model classes, wraps Keras's train function: at the end of the data it applies
the same decay, with Keras's own float operations (a store's
``HybridHashDecayAdamMoments`` op), before the error goes on to Keras. A step run eagerly
(``run_eagerly=True``) fails before any op, in plain Keras as here, and a
loss-scale wrapper (``mixed_float16``) applies its inner optimizer under a
condition on the gradients: neither decays anything, and neither does this.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.run import gradient_arrivals


def note_fused_adam(optimizer, variable, m, v) -> None:
    """Records (at trace time) that ``optimizer``'s fused Adam updates ``variable`` with moments ``m`` and ``v``."""
    if tf.executing_eagerly():
        return
    views = optimizer._htf_members.get(id(variable)) or []
    without = (
        set(gradient_arrivals.tables_without_gradient([view.table for view in views])) if len(views) > 1 else set()
    )
    # a regularized table's plain gradient is dense (its penalty's): Keras's dense Adam update needs the data
    regularized = set(optimizer._htf_storage.regularizers) if optimizer._htf_storage is not None else set()
    skipped = without | {view.table for view in views if view.table in regularized}
    ranges = None  # every row (of this rank's shard, when sharded)
    if skipped:
        ranges = tuple(view.local_rows() for view in views if view.table not in skipped)
        if not ranges:
            return
    plan = optimizer.__dict__.setdefault("_htf_end_of_data", {})
    plan[id(variable)] = (m, v, ranges)


def note_dynamic_adam(optimizer, table) -> None:
    """Records (at trace time) that ``optimizer``'s fused Adam updates the HybridHash store ``table`` (whose update
    decays every stored row's moments, as Keras's does every row's)."""
    if not tf.executing_eagerly():
        optimizer.__dict__.setdefault("_htf_end_of_data", {})[id(table)] = table


def _decay(optimizer) -> None:
    """Keras Adam's data-free start of a sparse update, ``s += -s * (1 - beta)``, on every noted row."""
    c1, c2 = (tf.constant(1 - beta, tf.float32) for beta in (optimizer.beta_1, optimizer.beta_2))
    for entry in optimizer.__dict__.get("_htf_end_of_data", {}).values():
        if not isinstance(entry, tuple):  # a dynamic table's store
            entry.decay_adam_moments(c1, c2)
            continue
        m, v, ranges = entry
        for slot, beta in ((m, optimizer.beta_1), (v, optimizer.beta_2)):
            if ranges is None:
                slot.assign_add(-slot * (1 - beta))
                continue
            for begin, end in ranges:
                part = slot[begin:end]
                slot[begin:end].assign(part + -part * (1 - beta))


class _EndOfDataStep:
    """Keras's train function of a model, applying the end-of-data decay when the data runs out.

    Anything else (``get_concrete_function``, ...) is the wrapped ``tf.function``'s.
    """

    def __init__(self, model, function):
        self._model = model
        self._function = function

    def __call__(self, iterator):
        try:
            return self._function(iterator)
        except (tf.errors.OutOfRangeError, StopIteration):
            optimizer = self._model.optimizer
            if not self._model.run_eagerly and optimizer is not None and optimizer.__dict__.get("_htf_end_of_data"):
                _decay(optimizer)
            raise

    def __getattr__(self, name):
        function = self.__dict__.get("_function")
        if function is None:  # (an instance being copied or unpickled)
            raise AttributeError(name)
        return getattr(function, name)


class EndOfDataMixin:
    """An optimized model's train function applies the end-of-data decay (the model classes' first base)."""

    def make_train_function(self, force=False):
        cached = self.train_function
        function = super().make_train_function(force)
        if function is None or function is cached:  # Keras's cached one: wrapped already (maybe further, by others)
            return function
        self.train_function = _EndOfDataStep(self, function)
        return self.train_function

"""Slots of ``tf.keras.optimizers.legacy`` optimizers for packed tables, checkpointed in the plain layout.

A legacy optimizer (``OptimizerV2``) keys its slots by variable and checkpoints
them through the object graph: each variable of the graph gets its slots as
``<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>``, found by
``optimizer.get_slot(variable, name)``. An optimized model's graph holds its
tables' ``TableView``s, not the packed variables the optimizer trains, so
without help the packed tables' slots are neither saved nor restored.

``hook_legacy_slots`` gives the optimizer (this instance only) two overrides:

* ``get_slot(view, name)`` answers for a table's view with the view of that
  table's rows in the packed variable's slot, so every save writes one slot per
  table under the table's own key, as the plain model does;
* ``_create_or_restore_slot_variable`` (a restore, before or after the slots
  exist) creates the packed variable's slots with the optimizer's initial values
  and restores the checkpoint's slot into the table's rows of them.

An optimizer that trained the plain model before ``optimize`` keeps its state:
each table's slots are copied into its rows of the packed slots (the view
answers with the key of the variable it replaced).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.capture.subclassing import runtime_subclass


def _var_key(variable) -> str:
    from keras.src.optimizers.legacy.optimizer_v2 import _var_key as key  # how a legacy optimizer keys slots

    return key(variable)


def _legacy_base():
    return getattr(tf.keras.optimizers, "legacy", None) and tf.keras.optimizers.legacy.Optimizer


def is_legacy(optimizer) -> bool:
    base = _legacy_base()
    return bool(base) and isinstance(optimizer, base)


class _LegacySlotsMixin:
    """Per-instance overrides of a legacy Keras optimizer training packed tables (see the module docstring)."""

    def _htf_packed_view(self, variable):
        """``variable`` if it is a view of one of the hooked storage's packed tables, else None."""
        storage = self.__dict__.get("_htf_legacy_storage")
        table = getattr(variable, "table", None)
        if storage is None or not isinstance(table, str) or table not in self.__dict__["_htf_legacy_tables"]:
            return None
        view = storage.view(table)
        return view if variable is view else None

    def _htf_slot(self, view, slot_name: str, create: bool = False):
        packed = view._variable
        slots = self._slots.get(_var_key(packed), {})
        if slot_name not in slots and create:
            with tf.init_scope():
                self._create_all_weights([packed])
            slots = self._slots.get(_var_key(packed), {})
        slot = slots.get(slot_name)
        return None if slot is None else self.__dict__["_htf_legacy_storage"].slot_view(slot, view.table)

    def get_slot(self, var, slot_name):
        view = self._htf_packed_view(var)
        if view is None:
            return super().get_slot(var, slot_name)
        slot = self._htf_slot(view, slot_name)
        if slot is None:
            raise KeyError(f"no slot {slot_name!r} for packed table {view.table!r} yet")
        return slot

    def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
        view = self._htf_packed_view(variable)
        if view is None:
            return super()._create_or_restore_slot_variable(slot_variable_position, slot_name, variable)
        slot = self._htf_slot(view, slot_name, create=True)
        if slot is not None:
            slot_variable_position.restore(slot)


def hook_legacy_slots(optimizer, storage) -> None:
    """Hooks a legacy Keras ``optimizer`` (in place) so the slots of ``storage``'s packed tables checkpoint per table.

    One process only (a Horovod job's shards take another route). Slots the
    optimizer already holds for the tables' former variables are copied in.
    """
    if not storage.packed or storage.world.distributed:
        return
    if not isinstance(optimizer, _LegacySlotsMixin):
        optimizer.__class__ = runtime_subclass(_LegacySlotsMixin, type(optimizer))
    tables = {m.name for pt in storage.plan.packed_tables for m in pt.members}
    object.__setattr__(optimizer, "_htf_legacy_storage", storage)
    object.__setattr__(optimizer, "_htf_legacy_tables", frozenset(tables))  # get_slot runs per object and slot
    for table in sorted(tables):
        view = storage.view(table)
        old = optimizer._slots.get(view._htf_plain_key or "", {})
        for slot_name, value in old.items():
            optimizer._htf_slot(view, slot_name, create=True).assign(value)

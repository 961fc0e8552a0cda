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
        """(storage, view) if ``variable`` is a view of one of the hooked storages' packed tables, else None."""
        table = getattr(variable, "table", None)
        if not isinstance(table, str):
            return None
        for storage, tables in self.__dict__.get("_htf_legacy_storages", ()):
            if table in tables and storage.view(table) is variable:
                return storage, variable
        return None

    def _htf_slot(self, storage, view, slot_name: str, create: bool = False):
        packed = view._variable
        slots = self._slots.get(_var_key(packed), {})
        if slot_name not in slots and create:
            with tf.init_scope():
                self._create_all_weights([packed])
            slots = self._slots.get(_var_key(packed), {})
        slot = slots.get(slot_name)
        return None if slot is None else storage.slot_view(slot, view.table)

    def get_slot(self, var, slot_name):
        found = self._htf_packed_view(var)
        if found is None:
            return super().get_slot(var, slot_name)
        slot = self._htf_slot(*found, slot_name)
        if slot is None:
            raise KeyError(f"no slot {slot_name!r} for packed table {var.table!r} yet")
        return slot

    def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
        found = self._htf_packed_view(variable)
        if found is None:
            return super()._create_or_restore_slot_variable(slot_variable_position, slot_name, variable)
        slot = self._htf_slot(*found, slot_name, create=True)
        if slot is not None:
            slot_variable_position.restore(slot)


def hook_legacy_slots(optimizer, storage) -> None:
    """Hooks a legacy Keras ``optimizer`` (in place) so the slots of ``storage``'s packed tables checkpoint per table.

    One process only (a Horovod job's shards take another route). One optimizer may train the tables of
    several storages (a custom step over two ``Tables`` sets). State the optimizer already holds for a table
    is moved in: slots of the tables' former variables (an optimizer that trained the plain model), and what a
    checkpoint restored before the hook (slots the optimizer created for the table's view, keyed by it, or
    restorations it deferred until such slots exist), which training would otherwise never read.
    """
    if not storage.packed or storage.world.distributed:
        return
    if not isinstance(optimizer, _LegacySlotsMixin):
        optimizer.__class__ = runtime_subclass(_LegacySlotsMixin, type(optimizer))
    hooked = optimizer.__dict__.get("_htf_legacy_storages", ())
    if any(known is storage for known, _ in hooked):
        return
    tables = frozenset(m.name for pt in storage.plan.packed_tables for m in pt.members)
    # get_slot runs per object and slot: a tuple, set outside Keras's attribute tracking
    object.__setattr__(optimizer, "_htf_legacy_storages", (*hooked, (storage, tables)))
    with tf.init_scope():  # hooked while a step is traced too: the state moves once, now, not in every step
        _adopt_held_state(optimizer, storage, tables)


def _adopt_held_state(optimizer, storage, tables) -> None:
    for table in sorted(tables):
        view = storage.view(table)
        key = _var_key(view)  # the former variable's key, else the view's own
        held = optimizer._slots.get(key, {})
        for slot_name, value in held.items():
            optimizer._htf_slot(storage, view, slot_name, create=True).assign(value)
        if view._htf_plain_key is None and held:  # the view's own stray slots: not trained, not to be saved
            del optimizer._slots[key]
            stray = {id(v) for v in held.values()}
            optimizer._weights[:] = [w for w in optimizer._weights if id(w) not in stray]
        for slot_name, deferred in optimizer._deferred_slot_restorations.items():
            positions = deferred.pop(key, [])
            if positions:
                slot = optimizer._htf_slot(storage, view, slot_name, create=True)
                for position in sorted(positions, key=lambda p: p.restore_uid):  # the latest restore last
                    position.restore(slot)

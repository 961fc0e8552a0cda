"""Optimizer state of an optimized Keras model, saved and restored in the plain model's layout.

Keras 2.15 keys an optimizer's variables by position: ``optimizer/_variables/<i>``
in TensorFlow checkpoints, ``"<i>"`` in ``.keras`` and ``.weights.h5`` files.
Position ``i`` is the ``i``-th variable ``build(var_list)`` created: the
iteration counter, then the slots of the trained variables in their order
(Adagrad: one accumulator per variable; Adam: ``m`` and ``v`` per variable; EMA:
a first pass of averages, ...). The optimized model trains one packed variable
in place of several tables, so its own list is shorter and in another order.

``plain_variables`` lists the optimizer's variables at the positions the plain
model's optimizer would have them: each slot of a packed table is replaced, at
each of its member tables' positions, by a ``TableView`` of the member's rows in
the slot. Every save format writes this list, and restores into it, so
optimizer state moves between the plain and the optimized model in both
directions, and between optimized models of different plans.

Passes over ``var_list`` are recovered from the order the slots were created
in (a new pass starts when the trained variable's index goes back, or repeats
a slot name). A slot that is not shaped like its packed table (not one row
per table row), or an optimizer variable that is not any model variable's
slot (e.g. Adafactor's factored moments), cannot be split per table: saving
raises ``OptimizerLayoutError`` naming it instead of writing state that
would restore wrongly.
"""

from __future__ import annotations

import os

import tensorflow as tf

from hybridtf._src.errors import HybridTFError


class OptimizerLayoutError(HybridTFError, ValueError):
    """Optimizer state that cannot be written or restored in the plain model's layout without losing it."""


class PlainSlots(tf.__internal__.tracking.Trackable):
    """The optimizer's variables in the plain model's positions: the ``_variables`` checkpoint child.

    One object per optimizer, kept across saves and restores: a restore before
    the optimizer is built leaves its children deferred, and they are
    restored when ``update`` tracks them after the build.
    """

    def __init__(self):
        self._items: list = []

    def update(self, items: list) -> None:
        for i, item in enumerate(items):
            if i >= len(self._items) or self._items[i] is not item:
                self._track_trackable(item, name=str(i), overwrite=True)
        self._items = list(items)

    @property
    def items(self) -> list:
        return list(self._items)


def adopt_deferred_restore(optimizer) -> None:
    """Moves a checkpoint's optimizer variables, read before ``optimizer`` was hooked, to its ``PlainSlots``.

    A custom loop's optimizer is hooked when ``hybridtf.function`` first
    traces the step; ``tf.train.Checkpoint(...).restore`` before that leaves
    the saved ``_variables/<i>`` (plain layout) deferred on the optimizer's own
    variable list, which its build fills in the packed order: each value would
    land on the wrong slot. Held by ``PlainSlots`` instead, they restore into
    the plain positions once the optimizer is built.
    """
    own = optimizer.__dict__.get("_variables")
    if own is None or getattr(optimizer, "_built", False):
        return
    own._maybe_initialize_trackable()
    pending = own._deferred_dependencies
    if not pending:
        return
    plain = optimizer._htf_plain
    plain._maybe_initialize_trackable()
    for name, positions in list(pending.items()):
        plain._deferred_dependencies.setdefault(name, []).extend(positions)
    pending.clear()


def slot_name(slot: tf.Variable) -> str:
    """The slot kind of an optimizer variable named ``<kind>/<variable>``, e.g. ``m``."""
    return slot.name.split("/", 1)[0]


def plain_variables(optimizer, storage, plain_order: list) -> list:
    """``optimizer.variables`` at the plain model's positions (see the module docstring).

    Args:
        optimizer: a built Keras optimizer of the optimized model whose slots
            were recorded (``optimizer._htf_slot_of``: ``id(slot) -> (model
            variable, slot kind)``) and whose ``build`` argument was kept
            (``optimizer._htf_var_list``).
        storage: the model's ``PackedTables``.
        plain_order: the plain model's trained variables, a table's name
            where the plain model had the table's own variable.

    Raises:
        OptimizerLayoutError: a slot of a packed table is not shaped like it.
    """
    slot_of = getattr(optimizer, "_htf_slot_of", {})
    index = {id(v): i for i, v in enumerate(getattr(optimizer, "_htf_var_list", ()))}
    packed_ids = {id(v): name for name, v in storage.packed.items()}
    placed: set[int] = set()
    out: list = []

    def emit(run):
        by_var: dict[int, list] = {}
        for model_var, slot in run:
            by_var.setdefault(id(model_var), []).append(slot)
        for entry in plain_order:
            if isinstance(entry, str):
                packed_name, _ = storage.plan.location(entry)
                for slot in by_var.get(id(storage.packed[packed_name]), ()):
                    _check_row_slot(optimizer, slot, storage.packed[packed_name], packed_name, storage)
                    out.append(storage.slot_view(slot, entry))
                    placed.add(id(slot))
            else:
                for slot in by_var.get(id(entry), ()):
                    out.append(slot)
                    placed.add(id(slot))
        for model_var, slot in run:  # trained by the optimizer, but not a variable of the plain model
            if id(slot) not in placed and id(model_var) not in packed_ids:
                out.append(slot)
                placed.add(id(slot))

    run: list = []
    prev, seen = -1, set()
    for var in optimizer.variables:
        entry = slot_of.get(id(var))
        if entry is None:  # iterations, or a variable not made from a model variable
            if var.shape.rank:
                raise OptimizerLayoutError(
                    f"{type(optimizer).__name__} keeps a variable {var.name!r} of shape {var.shape.as_list()} that "
                    "is not a slot of one model variable (it was made with add_variable): hybridtf cannot tell "
                    "which tables' rows it holds, so saving it in the plain model's layout would lose or garble "
                    "it. Use an optimizer whose slots are shaped like the variables (SGD, Adagrad, Adam, "
                    "RMSprop, Ftrl, ...), or leave the tables unpacked (hybridtf.keras.optimize(model, exclude=[...]))."
                )
            emit(run)
            run, prev, seen = [], -1, set()
            out.append(var)
            continue
        model_var, kind = entry
        i = index.get(id(model_var), -1)
        if i < prev or (i == prev and kind in seen):
            emit(run)
            run, seen = [], set()
        if i != prev:
            seen = set()
        seen.add(kind)
        prev = i
        run.append((model_var, var))
    emit(run)
    return out


def _check_row_slot(optimizer, slot, packed, packed_name, storage) -> None:
    if slot.shape.rank and slot.shape.as_list() == packed.shape.as_list():
        return
    tables = ", ".join(storage.members(packed_name))
    raise OptimizerLayoutError(
        f"{type(optimizer).__name__} keeps a slot {slot.name!r} of shape {slot.shape.as_list()} for packed table "
        f"{packed_name!r} of shape {packed.shape.as_list()}: it is not one row per table row, so it cannot be split "
        f"into the state of tables {tables}, and saving would lose it. Use an optimizer whose slots are shaped like "
        "the variables (SGD, Adagrad, Adam, RMSprop, Ftrl, ...), or exclude these tables from packing "
        "(hybridtf.keras.optimize(model, exclude=[...]))."
    )


def saved_variable_count(filepath, attribute: str = "optimizer") -> int | None:
    """How many variables the Keras file ``filepath`` (``.keras`` / ``.weights.h5``) holds for the model's optimizer
    attribute ``attribute``; None when the file cannot be read or holds none."""
    import io
    import zipfile

    import h5py

    try:
        path = os.fspath(filepath)
        if path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive:
                source = io.BytesIO(archive.read("model.weights.h5"))
        else:
            source = path
        with h5py.File(source, "r") as weights:
            group = weights.get(f"{attribute}/vars")
            return None if group is None else len(group.keys())
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None  # Keras's own loading reports an unreadable file


def variables_per_build(optimizer, user_class: type) -> tuple[int, int] | None:
    """``(base, per_variable)``: a fresh ``user_class`` optimizer with ``optimizer``'s configuration holds
    ``base + per_variable * n`` variables once built over ``n`` variables (measured on one-element stand-ins);
    None if that cannot be measured."""
    try:
        counts = []
        for n in (1, 2):
            probe = user_class.from_config(optimizer.get_config())
            with tf.init_scope():
                probe.build([tf.Variable(tf.zeros([1]), name=f"probe_{i}") for i in range(n)])
            counts.append(len(probe.variables))
    except Exception:  # an optimizer that cannot be rebuilt from its config: not measurable
        return None
    per_variable = counts[1] - counts[0]
    return counts[0] - per_variable, per_variable


def build_optimizer(model, filepath=None, user_class=type) -> None:
    """Builds ``model``'s Keras optimizer on its trainable variables if it is not built yet.

    Keras files hold the optimizer's state by position, so a file is loaded into a built optimizer. When the
    file ``filepath`` holds this optimizer's state over fewer variables than the model trains (a custom
    ``train_step`` gives the compiled optimizer only some of them), the optimizer stays unbuilt: its state is
    then skipped with a warning, as Keras skips it for the plain model. A file of another optimizer (a count no
    build of this one makes) is loaded into the build and refused there, naming the fix. ``user_class`` gives
    the optimizer's own class under hybridtf's and Horovod's run-time ones (``keras_optimizers.user_class``).
    """
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer) or getattr(optimizer, "_built", False):
        return
    plain = getattr(model, "_htf_plain_trainable", None)
    saved = saved_variable_count(filepath) if filepath is not None and plain is not None else None
    layout = variables_per_build(optimizer, user_class(optimizer)) if saved is not None else None
    if layout is not None and layout[1] > 0:
        base, per_variable = layout
        trained, rest = divmod(saved - base, per_variable)
        # A dynamic table's distinct-rows buffer has no slots in the optimizer (its table holds them).
        slotted = sum(1 for v in plain if getattr(v, "_htf_dynamic_embedding", None) is None)
        if rest == 0 and 0 <= trained < slotted:  # this optimizer's state over only some of the variables
            return
    with tf.init_scope():
        optimizer.build(model.trainable_variables)

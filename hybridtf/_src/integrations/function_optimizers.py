"""The Keras optimizers of a ``hybridtf.function`` step: hooked, checked and warned about.

Before a step's record pass, ``attach_optimizers`` hooks the optimizers the step reaches directly into the
one optimized model it reaches (as ``compile`` would), and under Horovod those training ``Tables`` sharded
over the ranks. After it, knowing the ``Tables`` sets the step looked up: the legacy optimizers it reaches
(``reachable_optimizers``: also through helpers, containers and attributes) checkpoint those tables' slots
per table, a clipping optimizer is warned about (its clipping sees packed gradients), several optimizers
splitting an optimized model without ``layer_variables`` are noted, and an optimizer that moves every row of
a partly looked-up packed variable is warned about.
"""

from __future__ import annotations

import logging
import types

import tensorflow as tf

from hybridtf._src.once import first_time

_log = logging.getLogger("hybridtf")


def attach_optimizers(objects: list) -> None:
    """Hooks the Keras optimizers a step uses into the optimized model it uses, as ``compile`` would.

    A custom loop's optimizer is often never given to ``model.compile``; then
    its state for the packed tables would be checkpointed in the packed
    layout (``tf.train.Checkpoint(model=..., optimizer=...)`` would not load
    into the plain model, nor the plain model's into it) and its updates
    would not be fused. When the step reaches exactly one optimized model
    and some optimizers (arguments, closure, globals), each optimizer not
    yet hooked gets ``hybridize_optimizer`` with that model's tables (under
    Horovod it averages the gradients when the step did not), except for a
    model with L1/L2-regularized tables (a hooked optimizer adds their
    penalties' gradients, right only when the step's loss holds
    ``model.losses``). Under Horovod the optimizers left unhooked are then
    hooked to average (``_average_over_sharded_tables``). ``objects`` are what
    the step reaches directly (``_referenced``).
    """
    from hybridtf._src.integrations.keras_variables import hook_optimizers

    models = {}
    for obj in objects:
        if isinstance(obj, tf.keras.Model) and getattr(obj, "_htf_plain_trainable", None) is not None:
            models[id(obj._htf_runtime.storage)] = obj
    if len(models) == 1:
        hook_optimizers(next(iter(models.values())), objects)
    _average_over_sharded_tables(objects)


def _average_over_sharded_tables(objects: list) -> None:
    """Under Horovod, hooks the Keras optimizers of a step over ``Tables`` or Keras models with tables sharded
    over the ranks, not hooked yet (as ``dynamic_optimizer`` hooks them).

    The hooked optimizer averages the dense gradients over the ranks, and scales the shards' own, when the step
    did not (no ``DistributedGradientTape``, no ``average_gradients``: ``gradients.already_averaged``), as a
    compiled optimized model's does. Unhooked, each rank trained its own dense layers and the shards' gradients
    were not divided by the number of ranks, silently (found by a probe). A ``hvd.DistributedOptimizer``
    averages by itself; a legacy optimizer cannot be hooked: warned.
    """
    from hybridtf._src.caching.optimizer import _DynamicOptimizerMixin, dynamic_optimizer
    from hybridtf._src.capture.lookup_api import Tables
    from hybridtf._src.distribute.world import current_world
    from hybridtf._src.integrations.keras_horovod_classes import is_horovod_distributed
    from hybridtf._src.integrations.keras_optimizers import loss_scale_inner
    from hybridtf._src.integrations.keras_unpacked import rank_local_variables

    if not current_world().distributed:
        return
    sets = [obj for obj in objects if isinstance(obj, Tables)]
    sets += [m for obj in objects if isinstance(obj, tf.Module) for m in obj.submodules if isinstance(m, Tables)]
    sharded = False
    for tables in sets:  # the step's own, or a model's that the step calls
        storage = getattr(getattr(tables, "_htf_runtime", None), "storage", None)
        dynamic = any(t.table is not None and t.table.world.distributed for t in tables.dynamic_tables.values())
        sharded = sharded or dynamic or bool(storage is not None and storage.sharded)
    sharded = sharded or any(rank_local_variables(obj) for obj in objects if isinstance(obj, tf.keras.Model))
    if not sharded:
        return
    for obj in objects:
        inner = loss_scale_inner(obj) if isinstance(obj, tf.keras.optimizers.Optimizer) else None
        target = inner if inner is not None else obj
        if isinstance(target, tf.keras.optimizers.legacy.Optimizer) and not is_horovod_distributed(target):
            if first_time(target, "_htf_unaveraged_told"):
                _log.warning(
                    "hybridtf.function: the legacy optimizer %s trains tables sharded over the Horovod ranks; hybridtf "
                    "cannot hook it to average the dense gradients over the ranks when the step does not. Unless the "
                    "step averages them itself (htf.horovod.DistributedGradientTape(tape, tables), average_gradients), "
                    "each rank trains its own dense layers: average them there, or use a tf.keras.optimizers "
                    "optimizer (hooked).",
                    type(target).__name__,
                )
            continue
        if (
            isinstance(target, tf.keras.optimizers.Optimizer)
            and not isinstance(target, _DynamicOptimizerMixin)
            and getattr(target, "_htf_storage", None) is None
            and not is_horovod_distributed(target)
        ):
            dynamic_optimizer(obj)


def note_split_optimizers(objects: list) -> None:
    """After the record pass: several optimizers over one optimized model, split without ``layer_variables``."""
    from hybridtf._src.integrations.keras_variables import note_split_optimizers

    models = {id(o): o for o in objects if isinstance(o, tf.keras.Model) and getattr(o, "_htf_runtime", None)}
    for model in models.values():
        note_split_optimizers(model, objects)


def reachable_optimizers(python_function, objects: list, referenced, depth: int = 3, limit: int = 2_000) -> list:
    """The Keras optimizers (loss-scale wrappers' inner ones too) a step reaches: among ``objects``, and up to
    ``depth`` hops further through helper functions' closures and globals, containers and objects' attributes
    (``self.optimizer``, a bound method's object included; ``referenced(fn, args, kwargs)`` lists what a function
    reaches directly). Visits at most ``limit`` objects."""
    from hybridtf._src.integrations.keras_optimizers import loss_scale_inner
    from hybridtf._src.integrations.keras_variables import _OPTIMIZER_TYPES

    owner = getattr(python_function, "__self__", None)
    frontier = [*objects, *(vars(owner).values() if hasattr(owner, "__dict__") else ())]
    seen, found = set(), {}
    for _ in range(depth + 1):
        following = []
        for obj in frontier:
            if id(obj) in seen or len(seen) >= limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, _OPTIMIZER_TYPES):
                found[id(obj)] = obj
                inner = loss_scale_inner(obj)
                if inner is not None:
                    found[id(inner)] = inner
            elif isinstance(obj, (list, tuple)):
                following += obj
            elif isinstance(obj, dict):
                following += obj.values()
            elif callable(obj) and hasattr(getattr(obj, "__func__", obj), "__code__"):
                following += referenced(obj, (), {})
            elif not isinstance(obj, (type, types.ModuleType, tf.Variable, tf.Tensor)) and hasattr(obj, "__dict__"):
                following += vars(obj).values()  # a trainer object's attributes
        frontier = following
    return list(found.values())


def hook_tables_optimizers(requests, optimizers: list) -> None:
    """After the record pass: the legacy Keras optimizers a step reaches checkpoint the slots of the ``Tables``
    sets it looks up per table (``keras_legacy_slots``), as a compiled optimized model's do. Unhooked, a
    ``tf.train.Checkpoint`` of the tables and the optimizer held no slot of theirs, and training resumed
    with fresh slots, silently (found by a probe: Adam 0.49 relative off)."""
    from hybridtf._src.capture.lookup_api import Tables
    from hybridtf._src.integrations import keras_legacy_slots

    owners = {id(r.owner): r.owner for r in requests if isinstance(r.owner, Tables)}
    for opt in optimizers:
        if keras_legacy_slots.is_legacy(opt):
            for tables in owners.values():
                keras_legacy_slots.hook_legacy_slots(opt, tables._storage)


def warn_unhooked_clipping(requests, optimizers: list) -> None:
    """Warns (once per optimizer) when a step over ``Tables`` uses an optimizer that clips its gradients.

    No model hooks it, so it clips each packed variable's gradient as given: one summed row per distinct
    id, several tables in one variable, not the plain tables' per-lookup rows and per-table norms.
    """
    from hybridtf._src.capture.lookup_api import Tables

    if not any(isinstance(r.owner, Tables) for r in requests):
        return
    for opt in optimizers:
        settings = {k: v for k in ("clipnorm", "global_clipnorm", "clipvalue") if (v := getattr(opt, k, None))}
        if not settings or not first_time(opt, "_htf_clip_warned"):
            continue
        _log.warning(
            "hybridtf.function: optimizer %s clips gradients (%s) in a step over hybridtf Tables. It clips each "
            "packed variable's gradient as it is, one summed row per distinct id for several tables together, so "
            "once it clips the tables train unlike plain tf.Variable tables; clipping in your own step sees the "
            "same packed gradients and is not exact either. For exact clipping train an optimized Keras model "
            "(htf.keras.optimize) compiled with this tf.keras.optimizers optimizer, or train without clipping.",
            getattr(opt, "name", type(opt).__name__),
            ", ".join(f"{k}={v}" for k, v in settings.items()),
        )


def _row_local(optimizer) -> bool:
    """Whether ``optimizer``'s update of a variable with a sparse gradient changes only the gradient's rows."""
    from hybridtf._src.caching.optimizer import _DynamicOptimizerMixin
    from hybridtf._src.integrations.keras_optimizers import LazyAdam, user_class

    if getattr(optimizer, "weight_decay", None) or getattr(optimizer, "use_ema", False):
        return False
    base = user_class(optimizer, skip=(_DynamicOptimizerMixin,))  # under dynamic_optimizer's run-time class too
    if base is tf.keras.optimizers.legacy.SGD:  # its momentum setting is a hyperparameter tensor; this is a bool
        return not optimizer._momentum
    if base is tf.keras.optimizers.SGD:
        return not optimizer.momentum
    return base in (tf.keras.optimizers.Adagrad, tf.keras.optimizers.legacy.Adagrad, LazyAdam)


def warn_partly_looked_up(requests, objects) -> None:
    """Warns (once per Tables set and table set) when a step looks up some tables of a packed variable only.

    Plain TensorFlow skips a table variable without gradient; a packed variable has a gradient as soon as one
    of its tables has, and an optimizer that moves every row of such a variable (Adam's or RMSprop's decaying
    moments, momentum, weight decay, FTRL) then moves the other tables' rows too. A step over a ``Tables`` set
    is never hooked, so its rows are not kept as an optimized Keras model keeps them.
    """
    from hybridtf._src.capture.lookup_api import Tables
    from hybridtf._src.integrations.keras_variables import _OPTIMIZER_TYPES

    moving = [o for o in objects if isinstance(o, _OPTIMIZER_TYPES) and not _row_local(o)]
    if not moving:
        return
    used: dict[int, tuple] = {}  # id(Tables) -> (the Tables, names of the tables the step looks up)
    for request in requests:
        if isinstance(request.owner, Tables):
            used.setdefault(id(request.owner), (request.owner, set()))[1].add(request.table)
    for owner, names in used.values():
        for packed in owner.plan.packed_tables:
            members = [m.name for m in packed.members]
            idle = sorted(set(members) - names)
            if not idle or len(idle) == len(members):
                continue
            seen = owner.__dict__.setdefault("_htf_idle_warned", set())
            if tuple(idle) in seen:
                continue
            seen.add(tuple(idle))
            _log.warning(
                "hybridtf.function: this step looks up tables %s of packed variable %r but not %s, and optimizer %s "
                "moves every row of a variable with a gradient (moments, momentum or weight decay): the rows of %s "
                "will change, which plain tf.Variable tables without gradient would not. Give them a packed "
                "variable of their own (Tables(..., plan=htf.plan.plan_packing([c.spec() for c in configs], "
                "exclude=%s))), look them all up in each step, or train with SGD, Adagrad or htf.keras.LazyAdam.",
                sorted(set(members) & names),
                packed.name,
                idle,
                getattr(moving[0], "name", type(moving[0]).__name__),
                idle,
                idle,
            )

"""The steps of ``hybridtf.keras.optimize``, each a function that can be run and tested on its own.

``optimize`` (``keras_model.py``) runs them in order:

1. ``capture``: the model's packable ``Embedding`` layers, the ones skipped and why, their specs.
2. ``make_plan``: the packing plan, planned (PICASSO §III-B) or given by the user and checked.
3. ``pack_storage``: one packed variable per packed table from the layers' current weights; each
   layer's ``embeddings`` becomes a view of its rows; the ``PackedRuntime`` that runs the chains.
4. rewrite (``keras_model._rewrite_model``): the model's run-time subclass that runs the step
   through the packed chains, with its bookkeeping attributes.
5. ``install_hooks``: Horovod broadcast of the dense weights, the optimizer's fused updates, the
   interleaving wrappers (§III-C) and the collective guards.

Example:
    >>> captured, skipped, specs = capture(model)
    >>> plan = make_plan(specs)
    >>> print(plan)  # which tables would share a packed table
"""

from __future__ import annotations

import collections
import dataclasses

import tensorflow as tf

from hybridtf._src.capture.keras_capture import (
    CapturedTable,
    SkippedLayer,
    find_embeddings,
    hybrid_class,
    layer_parents,
    qualified_layer_name,
)
from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass
from hybridtf._src.distribute import agreement, watchdog
from hybridtf._src.distribute.agreement import check_same_settings
from hybridtf._src.distribute.world import World, current_world
from hybridtf._src.integrations import horovod_hooks, keras_interleave
from hybridtf._src.integrations.keras_optimizers import hybridize_optimizer
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.plan.tables import TableSpec, UnpackedTable
from hybridtf._src.rewrite import regularization
from hybridtf._src.rewrite.packed_storage import PackedTables, shared_scope
from hybridtf._src.rewrite.runtime import PackedRuntime


def capture(model: tf.keras.Model) -> tuple[list[CapturedTable], list[SkippedLayer], list[TableSpec]]:
    """Step 1: the model's packable embedding layers, the skipped ones with the reason, and their table specs.

    Example:
        >>> captured, skipped, specs = capture(model)
        >>> [s.name for s in specs], [(s.name, s.reason) for s in skipped]
    """
    captured, skipped = find_embeddings(model)
    specs = [TableSpec(t.name, t.num_rows, t.dim, t.dtype, "model") for t in captured]
    return captured, skipped, specs


def resolve_exclude(model: tf.keras.Model, captured: list[CapturedTable], dynamic_layers: list, exclude) -> tuple:
    """``optimize(exclude=...)`` as ``(static table names, dynamic layers)`` to leave unpacked.

    An entry is a table name (as ``model.hybridtf_plan`` lists it), a layer name, a layer name
    qualified by the sub-model that holds it (``"tower_b.emb"``), or the layer object itself.
    A name several embedding layers answer to (nested sub-models repeating a layer name) is an
    error listing them, never a silent pick of the first; so is a name no embedding layer has.

    Example:
        >>> names, dynamic = resolve_exclude(model, captured, [], ["tower_b.emb"])
    """
    if isinstance(exclude, (str, tf.keras.layers.Layer)):
        raise TypeError(f"exclude must be a collection of table names or layers, got {exclude!r}; use [{exclude!r}].")
    exclude = list(exclude)
    if not exclude:
        return [], []
    parents = layer_parents(model)
    tables = [(t.name, t.layer, qualified_layer_name(model, t.layer, parents), True) for t in captured]
    tables += [(layer.name, layer, qualified_layer_name(model, layer, parents), False) for layer in dynamic_layers]
    names, dynamic = [], []
    for entry in exclude:
        if isinstance(entry, tf.keras.layers.Layer):
            found = [t for t in tables if t[1] is entry]
            if not found:
                if hasattr(entry, "embeddings"):  # an embedding layer hybridtf leaves unpacked anyway
                    continue
                raise ValueError(
                    f"exclude lists layer {entry.name!r} ({type(entry).__name__}), which is not an embedding "
                    "table of this model; remove it from exclude."
                )
        elif isinstance(entry, str):
            found = [t for t in tables if entry == t[2]]  # <sub-model>.<layer>: one layer at most
            if not found:
                found = [t for t in tables if entry in (t[0], t[1].name)]
        else:
            raise TypeError(f"exclude entries are table names or layers, got {type(entry).__name__} {entry!r}.")
        if len(found) > 1:
            listed = ", ".join(f"{t[2]!r} (table {t[0]!r})" for t in found)
            raise ValueError(
                f"exclude names {entry!r}, which {len(found)} embedding layers answer to: {listed}. Name the "
                f"ones to leave unpacked by their sub-model, e.g. exclude={[t[2] for t in found]}, or pass the "
                "layer objects."
            )
        if not found:
            known = sorted(t[0] for t in tables)
            shown = ", ".join(repr(n) for n in known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "")
            raise ValueError(
                f"exclude names {entry!r}, which is not an embedding table of this model; its tables: "
                f"{shown or 'none'}."
            )
        name, layer, _, static = found[0]
        if static:
            names.append(name)
        else:
            dynamic.append(layer)
    return names, dynamic


def make_plan(
    specs: list[TableSpec],
    plan: PackingPlan | None = None,
    *,
    stats=None,
    exclude=(),
    force_groups=None,
    max_shards: int | None = None,
    shard_strategy: str = "mod",
    replicate_below_rows: int = 0,
) -> PackingPlan:
    """Step 2: the packing plan for ``specs``: ``plan`` checked against them, or a new one.

    Args:
        specs: the captured tables (``capture``).
        plan: a user plan to use as it is; checked against ``specs``.
        stats, exclude, force_groups, max_shards, shard_strategy, replicate_below_rows: as for
            ``optimize`` (``max_shards`` None: 8 with a GPU, else 1).

    Returns:
        A ``PackingPlan``; one without packed tables when there is nothing to pack.

    Raises:
        ValueError: ``plan`` packs a table the model does not have, or with another shape.
    """
    if plan is not None:
        _check_plan_matches(plan, specs)
        return plan
    if max_shards is None:
        max_shards = 8 if tf.config.list_physical_devices("GPU") else 1
    if not specs:
        return PackingPlan((), (), (), "uniform", 0.0, max_shards=max_shards)
    return plan_packing(
        specs,
        stats,
        exclude=tuple(exclude),
        force_groups=force_groups,
        max_shards=max_shards,
        shard_strategy=shard_strategy,
        replicate_below_rows=replicate_below_rows,
    )


def skipped_layers(skipped: list[SkippedLayer], plan: PackingPlan) -> list[SkippedLayer]:
    """The layers ``capture`` skipped plus the captured tables ``plan`` leaves unpacked, each with the fix."""
    return skipped + [SkippedLayer(u.name, _with_fix(u)) for u in plan.unpacked]


@dataclasses.dataclass
class PackedState:
    """What ``pack_storage`` made, and the model's weight orders from before (for save/restore).

    Attributes:
        runtime: the ``PackedRuntime`` (packed storage, plan, chains).
        world: the Horovod job (or one process) the tables were packed for.
        weighted_layers: ids of the model's layers that had weights.
        plain_weights: ``model.weights`` in the plain model's order, views where tables were.
        plain_trainable: ``model.trainable_weights`` in the plain order, table names where tables were.
    """

    runtime: PackedRuntime
    world: World
    weighted_layers: set
    plain_weights: list
    plain_trainable: list


class CheckpointIndexMixin(PlainConstruction):
    """A functional model's checkpoint names as before packing.

    Functional models name their layers ``layer_with_weights-<i>`` in TensorFlow checkpoints, counting
    the layers that have weights. A packed Embedding layer has none of its own (its rows live in the
    packed variable), which would shift the index of every later layer: each packed layer keeps the
    index it had (``_htf_weighted_layers``: ids of the layers that had weights before packing), so
    checkpoints load between the plain and the optimized model, nested sub-models included.
    """

    @property
    def _layer_checkpoint_dependencies(self):
        deps = collections.OrderedDict()
        weighted = 0
        for index, layer in enumerate(self.layers):
            if id(layer) in self._htf_weighted_layers or _has_weights(layer):
                deps[f"layer_with_weights-{weighted}"] = layer
                weighted += 1
            deps[f"layer-{index}"] = layer
        return deps


def _has_weights(layer) -> bool:
    try:
        return bool(layer.weights)
    except ValueError:  # not built yet: Keras counts it as a layer without weights too
        return False


class PlainWeightsMixin(PlainConstruction):
    """An optimized model, or a layer holding packed Embedding layers (a custom layer with a list of them,
    ``TimeDistributed``, a tower sub-model): ``get_weights`` / ``set_weights`` / ``count_params`` in the plain
    layer's order and shapes, each table's rows where its variable was (``_htf_plain_weights``; a Keras
    container gathers its sublayers' variables, and a packed layer holds none: it returned ``[]``)."""

    def get_weights(self):
        return [w.numpy() for w in self._htf_plain_weights]

    def set_weights(self, weights):
        own = self._htf_plain_weights
        if len(weights) != len(own):
            raise ValueError(f"layer {self.name!r} has {len(own)} weight(s) in the plain layout, got {len(weights)}")
        for w, value in zip(own, weights):
            w.assign(value)

    def count_params(self):
        return sum(int(w.shape.num_elements()) for w in self._htf_plain_weights)


def plain_weights_of_containers(model: tf.keras.Model, table_of_var: dict) -> list:
    """Before packing: ``(layer, plain order)`` of each layer below ``model`` that holds tables of sublayers
    (table name where a view will be)."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if any(id(w) in table_of_var for w in layer._trainable_weights + layer._non_trainable_weights):
            continue  # the table's own layer: its capture class keeps its weights
        weights = layer.weights if _has_weights(layer) else []
        if any(id(w) in table_of_var for w in weights):
            found.append((layer, [table_of_var.get(id(w), w) for w in weights]))
    return found


def keep_checkpoint_indices(model: tf.keras.Model) -> set:
    """Before packing: the ids of ``model``'s layers with weights; nested functional models keep theirs.

    Each functional model nested in ``model`` (towers built as sub-models) becomes a
    ``CheckpointIndexMixin`` of its own; ``model``'s class does that for itself with the returned set.
    """
    from keras.src.engine import functional

    for sub in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(sub, functional.Functional) and not isinstance(sub, CheckpointIndexMixin):
            object.__setattr__(sub, "_htf_weighted_layers", {id(layer) for layer in sub.layers if _has_weights(layer)})
            sub.__class__ = runtime_subclass(CheckpointIndexMixin, type(sub))
    return {id(layer) for layer in model.layers if _has_weights(layer)}


def pack_storage(
    model: tf.keras.Model, plan: PackingPlan, captured: list[CapturedTable], *, share_unique: bool = True
) -> PackedState:
    """Step 3: packed variables for ``plan``'s packed tables, filled from the layers' current weights.

    Each packed layer's ``embeddings`` becomes a ``TableView`` of its rows (its own variable is
    freed as soon as its table is packed), its class a run-time subclass whose lookups go through
    the capture context, and its regularizer's penalty reads the packed rows. The model's own
    class is not changed here (that is the rewrite step).

    Raises:
        ValueError: ``plan`` has no packed tables.
    """
    if not plan.packed_tables:
        raise ValueError("pack_storage needs a plan with packed tables.")
    packed_names = {m.name for pt in plan.packed_tables for m in pt.members}
    tables = {t.name: t for t in captured if t.name in packed_names}
    weighted_layers = keep_checkpoint_indices(model)
    table_of_var = {id(t.layer.embeddings): name for name, t in tables.items()}
    plain_order = [table_of_var.get(id(w), w) for w in model.weights]  # table name where a view will be
    plain_trainable = [table_of_var.get(id(w), w) for w in model.trainable_weights]  # the optimizer's order
    containers = plain_weights_of_containers(model, table_of_var)
    values = {name: t.layer.embeddings for name, t in tables.items()}
    runtime_box: list = []

    def swap_in_views(storage, names):
        # The packed table holds these tables now: point each layer at its view
        # and drop every reference to its own variable, freeing it right away.
        if not runtime_box:
            runtime_box.append(PackedRuntime(plan, storage, share_unique=share_unique))
        for name in names:
            layer = tables[name].layer
            old = values.pop(name)
            layer._trainable_weights = [w for w in layer._trainable_weights if w is not old]
            layer.__dict__.pop("call", None)  # a Keras SavedModel save may leave an instance-level call
            layer.__class__ = hybrid_class(type(layer))
            layer.embeddings = storage.view(name)
            layer.embeddings._htf_plain_key = old._unique_id  # optimizers' exclusions made before packing
            if tables[name].regularizer is not None:
                storage.regularizers[name] = tables[name].regularizer
            if getattr(layer, "embeddings_regularizer", None) is not None:
                regularization.replace_penalty(layer, old, layer.embeddings, storage)
            object.__setattr__(layer, "_htf_table", name)
            object.__setattr__(layer, "_htf_runtime", runtime_box[0])

    world = current_world()
    # Each packed variable is named under its tables' shared scope and ends as theirs do
    # ("wide_C/packed_1d_float32_model/embeddings"), so a custom step that picks variables by name ("wide" in
    # v.name, "embeddings" in v.name) finds it with its tables.
    names = {}
    for pt in plan.packed_tables:
        scope = shared_scope([values[m.name].name for m in pt.members])
        names[pt.name] = f"{scope}/{pt.name}/embeddings" if scope else f"{pt.name}/embeddings"
    PackedTables(plan, values, release=swap_in_views, world=world, variable_names=names)
    plain_weights = [tables[w].layer.embeddings if isinstance(w, str) else w for w in plain_order]
    for layer, order in containers:
        views = [tables[w].layer.embeddings if isinstance(w, str) else w for w in order]
        object.__setattr__(layer, "_htf_plain_weights", views)
        if not isinstance(layer, PlainWeightsMixin):
            layer.__class__ = runtime_subclass(PlainWeightsMixin, type(layer))
    return PackedState(runtime_box[0], world, weighted_layers, plain_weights, plain_trainable)


def install_hooks(
    model: tf.keras.Model,
    state: PackedState,
    *,
    fused_updates: bool = True,
    micro_batches: int | str = 1,
    interleave_from: str = "embedding",
    micro_batch_memory: float | None = None,
    interleave_groups=None,
    interleave_scale: float = 1.0,
    interleave_exclude=(),
) -> None:
    """Step 5: what the rewritten model needs around its step.

    Under Horovod every rank starts from rank 0's dense weights (the tables were broadcast when
    packed); an optimizer compiled before ``optimize`` gets the fused updates (its built state
    moves to the packed layout); the interleaving wrappers are attached; under Horovod the step
    functions are guarded so that no rank waits forever in a collective the others do not run.
    The model's cached step functions are dropped so that the next ``fit`` traces the new step.
    """
    world, runtime = state.world, state.runtime
    if world.distributed:  # every rank starts from rank 0's weights (the tables were broadcast when packed)
        table_vars = {id(v) for v in runtime.storage.packed.values()}
        with watchdog.collective_phase(world, watchdog.INITIAL_BROADCAST, f"model {model.name!r}"):
            others = [w for w in agreement.variables_only(model.weights) if id(w) not in table_vars]
            world.hvd.broadcast_variables(others, root_rank=0)
    object.__setattr__(model, "_htf_plain_trainable", state.plain_trainable)
    if getattr(model, "optimizer", None) is not None:  # compiled before optimize()
        hybridize_optimizer(model.optimizer, runtime.storage, fused_updates, state.plain_trainable)
        if "_htf_pending_values" in model.optimizer.__dict__:  # built: its state moves to the packed layout now
            model.optimizer.build(model.trainable_variables)
    keras_interleave.attach(
        model,
        micro_batches=micro_batches,
        interleave_from=interleave_from,
        micro_batch_memory=micro_batch_memory,
        interleave_groups=interleave_groups,
        interleave_scale=interleave_scale,
        interleave_exclude=interleave_exclude,
    )
    if world.distributed:  # after attach: interleaving checks the user's own train_step, not hybridtf's mixins
        horovod_hooks.guard_collectives(model)  # no rank waits forever in a step the others do not run
    model.train_function = model.test_function = model.predict_function = None


def _with_fix(unpacked: UnpackedTable) -> str:
    if unpacked.reason == "excluded by user":
        return "excluded by user (optimize(exclude=...)); remove it from exclude to pack it"
    return unpacked.reason


def _check_plan_matches(plan: PackingPlan, specs: list[TableSpec]) -> None:
    have = {s.name: s for s in specs}
    for pt in plan.packed_tables:
        for m in pt.members:
            spec = have.get(m.name)
            if spec is None:
                raise ValueError(
                    f"plan packs table {m.name!r} but the model has no packable embedding layer of that name."
                )
            if spec.num_rows != m.num_rows or spec.dim != pt.dim:
                raise ValueError(
                    f"plan has table {m.name!r} as {m.num_rows} x {pt.dim}, the model's layer is "
                    f"{spec.num_rows} x {spec.dim}."
                )


def check_ranks_agree(
    model, options: dict, plan: PackingPlan, dynamic_groups: list, captured: list[CapturedTable] = ()
) -> None:
    """Under Horovod: every rank optimizes with the same settings, plan and other variables (else ValueError).

    The variables besides the ``captured`` tables (dense layers, their names, shapes and dtypes) are compared
    too: Horovod matches each rank's broadcast and allreduce of a variable by its name, so ranks whose
    dense layers differ (another width, or other automatic names because one rank built another model
    first) would wait in different collectives.
    """
    settings = {k: options[k] for k in ("shard_strategy", "replicate_below_rows", "max_shards", "fused_updates")}
    settings.update({k: options[k] for k in ("fuse_concat", "share_unique", "fuse_dense", "micro_batches")})
    # which tables are packed together first (readable in the message), then the plan's whole layout
    settings["the packed tables"] = {pt.name: [m.name for m in pt.members] for pt in plan.packed_tables}
    settings["the packing plan"] = plan.packed_tables
    settings["the dynamic tables' packing"] = dynamic_groups
    tables = {id(w) for t in captured for w in t.layer.weights}
    key = "the model's other variables"
    others = [v for v in agreement.variables_only(model.variables) if id(v) not in tables]
    settings[key] = [f"{v.name} {v.shape.as_list()} {v.dtype.name}" for v in others]
    hints = {
        key: "Horovod matches the ranks' dense variables by name: Keras's automatic layer names depend on the layers "
        "a process built before (a model built first on one rank only shifts them), so name the layers, or build the "
        "same models in the same order on every rank."
    }
    check_same_settings(current_world(), settings, f"hybridtf.keras.optimize of model {model.name!r}", hints)

"""The variables that hold some layers' weights in an optimized model (per-layer optimizers).

A packed table's rows live in its packed variable, shared with the other
tables of its group, so a packed ``Embedding``'s own ``trainable_variables``
is empty and a ``DynamicEmbedding`` packed with others shows its group's
distinct-rows buffer. Code that trains some layers with their own optimizer
(Wide & Deep's FTRL for the wide tables and Adagrad for the rest, a custom
``train_step`` that splits the variables by layer) collects the variables with
``layer_variables``: each packed variable once, and an error when one holds
tables of layers on both sides of the split (such a split cannot be trained
exactly on a shared variable).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from hybridtf._src.once import first_time


def layer_variables(model, layers) -> list:
    """The trainable variables of ``model`` that hold the weights of ``layers``, each once.

    On a plain model this is the layers' ``trainable_variables``, deduplicated.
    On a model returned by ``hybridtf.keras.optimize``, a packed table stands
    for its packed variable (or, for packed ``DynamicEmbedding`` layers, their
    group's distinct-rows buffer); every other weight of the layers is their own.

    Args:
        model: a Keras model, optimized or not.
        layers: a layer or an iterable of layers of ``model`` (sub-models too:
            their layers count).

    Returns:
        The variables in first-seen order, without duplicates.

    Raises:
        ValueError: a packed variable also holds tables of layers that are not
            in ``layers``: name them, and the fix (``optimize(model,
            force_groups=...)`` or ``exclude=[...]`` so that the two sides are
            packed apart).

    Example:
        >>> wide = htf.keras.layer_variables(model, wide_layers)      # FTRL
        >>> deep = [v for v in model.trainable_variables if all(v is not w for w in wide)]  # Adagrad
    """
    if isinstance(layers, tf.keras.layers.Layer):
        layers = [layers]
    chosen = _expand(list(layers))
    wanted = {id(layer) for layer in chosen}
    runtime = getattr(model, "_htf_runtime", None)
    storage = getattr(runtime, "storage", None)
    owners = _table_owners(model) if storage is not None else {}
    if storage is not None:
        object.__setattr__(model, "_htf_split_by_layer", True)  # no note_split_optimizers warning
    out, seen = [], set()

    def add(variable):
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append(variable)

    for layer in chosen:
        group = getattr(layer, "_htf_runtime", None)
        if group is not None and hasattr(group, "rows_buffer"):  # a packed DynamicEmbedding
            outside = [other.name for other in group.layers if id(other) not in wanted]
            if outside:
                raise _split_error(layer.name, group.plan.name, outside, "dynamic")
        for variable in layer.trainable_variables:
            add(variable)
        table = getattr(layer, "_htf_table", None)
        if storage is None or table is None or not layer.trainable:
            continue
        packed_name, _ = storage.plan.location(table)
        outside = sorted(
            {owners[m].name for m in storage.members(packed_name) if m in owners and id(owners[m]) not in wanted}
        )
        if outside:
            raise _split_error(layer.name, packed_name, outside, "static")
        add(storage.packed[packed_name])
    return out


def _expand(layers: list) -> list:
    """``layers`` with the layers of every sub-model among them, in order."""
    out = []
    for layer in layers:
        if not isinstance(layer, tf.keras.layers.Layer):
            raise TypeError(f"layer_variables takes Keras layers, got {type(layer).__name__}.")
        out.append(layer)
        if isinstance(layer, tf.keras.Model):
            out.extend(sub for sub in layer._flatten_layers(include_self=False))
    return out


def _table_owners(model) -> dict:
    """Packed table name -> the layer that looks it up."""
    return {
        layer._htf_table: layer
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "_htf_table", None) is not None
    }


def _split_error(name: str, packed: str, outside: list, kind: str) -> ValueError:
    if kind == "dynamic":
        fix = f"optimize(model, exclude=[...]) for the layers to train apart (e.g. exclude={outside})"
    else:
        fix = (
            "optimize(model, force_groups={...}) to pack these layers' tables apart from the others, or "
            f"optimize(model, exclude={outside})"
        )
    return ValueError(
        f"layer {name!r}: its table is packed in {packed!r} with the tables of layers {outside}, which are not "
        "among the layers asked for; one variable cannot be split between two optimizers. Use " + fix + "."
    )


def hook_optimizers(model, candidates) -> None:
    """Hooks each Keras optimizer among ``candidates`` not hooked yet into optimized ``model``, as ``compile`` does.

    Its state for the packed tables is then checkpointed in the plain model's
    layout and its updates are fused. In a Horovod job it averages the
    gradients over the ranks when the step did not (``gradients.already_averaged``),
    as a compiled optimizer does: unhooked, each rank of a step that averaged
    nothing trained its own dense layers. Not for a model with L1/L2-regularized
    tables (a hooked optimizer adds their penalties' gradients itself, right
    only when the step's loss holds ``model.losses``, as compile's does).
    """
    from hybridtf._src.integrations.keras_legacy_slots import is_legacy
    from hybridtf._src.integrations.keras_optimizers import clipping_can_be_exact, hybridize_optimizer, warn_inexact

    storage = model._htf_runtime.storage
    if storage.regularizers:
        return
    for obj in candidates:
        if isinstance(obj, tf.keras.optimizers.Optimizer) and getattr(obj, "_htf_storage", None) is None:
            exact = clipping_can_be_exact(model, obj) or None  # None: leave the model's clipping as it is
            hybridize_optimizer(obj, storage, model._htf_fused_updates, model._htf_plain_trainable, exact)
        elif is_legacy(obj) and storage.packed and first_time(obj, "_htf_inexact_named"):
            warn_inexact(obj)  # a legacy optimizer clips the packed rows in its own apply_gradients, as compile says


def hook_attribute_optimizers(model) -> None:
    """Hooks the Keras optimizers ``model`` holds as attributes besides its compiled one (``hook_optimizers``).

    A custom ``train_step`` that trains some layers with an optimizer of its own
    (``self.wide_optimizer``, given ``layer_variables(...)``) then keeps that
    optimizer's state in the plain model's layout too, so its checkpoints move
    between the plain and the optimized model.
    """
    hook_optimizers(model, [v for v in list(vars(model).values()) if v is not model.optimizer])


def note_split_train_step(model) -> None:
    """``note_split_optimizers`` for a ``train_step`` of the user's (traced by ``fit``): the compiled optimizer and
    the Keras optimizers the model holds as attributes (``self.item_optimizer``)."""
    from hybridtf._src.rewrite.micro_batch import overrides_train_step

    if getattr(model, "_htf_split_warned", False) or not overrides_train_step(model):
        return
    attributes = [v for v in list(vars(model).values()) if isinstance(v, _OPTIMIZER_TYPES)]
    note_split_optimizers(model, [getattr(model, "optimizer", None), *attributes])


def note_split_optimizers(model, candidates) -> None:
    """Warns once per model when a step trains optimized ``model`` with several optimizers among ``candidates``
    (called after ``hybridtf.function``'s record pass, or after ``fit`` traced the user's ``train_step``: not when
    they called ``layer_variables``).

    Such a step splits the model's variables among them, and a split by variable name or position
    (``"emb_" in v.name``, ``grads[:3]``) silently goes wrong on the optimized model: its
    ``trainable_variables`` hold each packed variable (several tables, named after their group) in
    place of the tables' own variables. ``layer_variables`` splits by layer on both models.
    """
    storage = model._htf_runtime.storage
    optimizers = {id(o): o for o in candidates if isinstance(o, _OPTIMIZER_TYPES)}
    if len(optimizers) < 2 or not storage.packed:
        return
    if getattr(model, "_htf_split_by_layer", False) or not first_time(model, "_htf_split_warned"):
        return  # the step splits with layer_variables, or told already
    packed = {
        storage.packed[pt.name].name: [m.name for m in pt.members]
        for pt in storage.plan.packed_tables
        if pt.name in storage.packed
    }
    _log.warning(
        "hybridtf: model %r is trained with %d optimizers (%s). Its trainable_variables hold the packed "
        "variables %s in place of those tables' own variables (after the model's other variables), so a "
        "split of the variables among the optimizers by name or by position sees the packed variables, not "
        "the tables: a filter on a table's name matches nothing, and a sub-model's (a tower's) "
        "trainable_variables hold none of its packed tables. Split by layer with "
        "hybridtf.keras.layer_variables(model, layers), which gives on the plain and the optimized model the "
        "variables holding those layers' weights.",
        model.name,
        len(optimizers),
        ", ".join(getattr(o, "name", type(o).__name__) for o in optimizers.values()),
        packed,
    )


_log = logging.getLogger("hybridtf")
_OPTIMIZER_TYPES = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)


__all__ = [
    "hook_attribute_optimizers",
    "hook_optimizers",
    "layer_variables",
    "note_split_optimizers",
    "note_split_train_step",
]

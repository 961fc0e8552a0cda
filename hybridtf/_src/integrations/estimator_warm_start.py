"""Estimator ``warm_start_from`` for a wrapped model_fn: packed tables warm-start per member table.

``tf.estimator.Estimator(model_fn, warm_start_from=...)`` calls
``tf.compat.v1.train.warm_start`` after the model_fn built its graph (train,
and evaluate without a checkpoint). It selects variables by name
(``vars_to_warm_start``: a regex over the trainable variables, a list of
regexes over all global variables, or variable objects) and reads each from
the checkpoint under its own name (or ``var_name_to_prev_var_name``). A
packed variable's name is in no checkpoint: the plain model_fn's checkpoint
and the wrapped one's (``estimator_saver``) hold one entry per table,
``<layer>/embeddings`` (slots ``<layer>/embeddings/<slot>``).

``apply`` runs at the end of the wrapped model_fn. It finds the Estimator
that called it (the ``self`` of a calling frame; nothing global is changed)
and, when that Estimator will warm-start:

* selects the member tables (and the slots of packed variables, for lists
  of names) exactly as TensorFlow would select the plain model_fn's
  variables, and makes each packed variable's initializer read its selected
  members from the checkpoint (``RestoreV2`` of each member's entry, shapes
  checked) and keep its other rows' own initial values;
* hands TensorFlow the same settings without the packed variables (the
  other selected variables as a list of variable objects of this graph;
  ``var_name_to_prev_var_name`` without the members, which are renamed here).

The Estimator's own settings are kept (``_htf_warm_start_settings``) and
re-derived for each graph. Vocabulary remapping (``var_name_to_vocab_info``)
of a packed table is refused with the fix (leave the table unpacked).
"""

from __future__ import annotations

import re
import sys

import tensorflow as tf
from tensorflow.python.training import checkpoint_utils, warm_starting_util

_KEPT = "_htf_warm_start_settings"


def _calling_estimator():
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, tf.estimator.Estimator):
            return owner
        frame = frame.f_back
    return None


def _selected_by_name(vars_to_warm_start, name: str, trainable: bool) -> bool:
    """Whether TensorFlow's warm start would select a variable called ``name`` (``<op name>:0``)."""
    if vars_to_warm_start is None or isinstance(vars_to_warm_start, str):
        return trainable and re.match(vars_to_warm_start or "", name) is not None
    if all(isinstance(v, str) for v in vars_to_warm_start):
        return any(re.match(v, name) is not None for v in vars_to_warm_start)
    return False  # a list of variable objects: the user's own, never a packed table's member


def apply(packed: dict, members: dict, shards: dict, mode) -> None:
    """Warm-starts the packed variables per member table, if the calling Estimator warm-starts.

    Args:
        packed: packed variable op name -> packed variable.
        members: packed variable op name -> [(checkpoint key, row offset, rows)].
        shards: packed variable op name -> (ShardLayout, World) of sharded ones.
        mode: the model_fn's mode.

    Raises:
        ValueError: a selected table is not in the checkpoint, or has another shape.
        NotImplementedError: vocabulary remapping of a packed table.
    """
    if mode not in (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL):
        return
    est = _calling_estimator()
    if est is None:
        return
    settings = est.__dict__.get(_KEPT, est._warm_start_settings)
    if settings is None or tf.train.latest_checkpoint(est.model_dir):
        return
    object.__setattr__(est, _KEPT, settings)
    ckpt, selection, vocab_info, prev_names = settings
    vocab_info, prev_names = dict(vocab_info or {}), dict(prev_names or {})
    ckpt_file = checkpoint_utils._get_checkpoint_filename(ckpt)
    reader = tf.train.load_checkpoint(ckpt_file)
    shapes = reader.get_variable_to_shape_map()

    # The packed variables and their slots (named <packed>/<slot>, same shape), with their members' keys.
    handled = {}
    for var in tf.compat.v1.global_variables():
        name = var.op.name
        owner = name if name in packed else next((p for p in packed if name.startswith(p + "/")), None)
        if owner is None or var.shape != packed[owner].shape:
            continue
        suffix = name[len(owner) :]
        handled[id(var)] = (var, owner, [(key + suffix, off, num) for key, off, num in members[owner]])

    trainable = {id(v) for v in tf.compat.v1.trainable_variables()}
    for var, owner, parts in handled.values():
        chosen = [p for p in parts if _selected_by_name(selection, p[0] + ":0", id(var) in trainable)]
        for key, _, _ in chosen:
            if key in vocab_info:
                raise NotImplementedError(
                    f"warm start with a vocabulary remapping (var_name_to_vocab_info) of table {key!r}, which "
                    "hybridtf packs: leave the table unpacked (hybridtf.estimator.model_fn(fn, exclude=[<layer "
                    "name>])) to warm-start it with its vocabulary."
                )
        if chosen:
            warm_start_rows(var, parts, {p[0] for p in chosen}, prev_names, ckpt_file, shapes, shard=shards.get(owner))

    # TensorFlow warm-starts everything else it would have selected.
    grouped = warm_starting_util._get_grouped_variables(selection)
    rest = [v for group in grouped.values() for v in group if id(v) not in handled]
    rest_names = {v.op.name for v in rest}
    est._warm_start_settings = settings._replace(
        vars_to_warm_start=rest,
        var_name_to_vocab_info={k: v for k, v in vocab_info.items() if k in rest_names} or None,
        var_name_to_prev_var_name={k: v for k, v in prev_names.items() if k in rest_names} or None,
    )


def warm_start_rows(var, parts, chosen, prev_names, ckpt_file, shapes, what: str = "warm start", shard=None) -> None:
    """Makes ``var``'s initializer read the ``chosen`` members from the checkpoint, the others as before.

    ``what`` names the caller in errors: "warm start" (``warm_start_from``) or "init_from_checkpoint".
    ``shard``: ``(ShardLayout, World)`` of a packed variable sharded over Horovod ranks. Each rank then
    reads every chosen member's whole tensor (the checkpoint holds the plain layout) and keeps its own
    rows in local order (``ShardLayout.own_rows``); a member's rows on a rank are consecutive local
    rows, in member order, so the shard is the concatenation of the members' parts as without sharding.
    """
    fix = {
        "warm start": "name its entry with var_name_to_prev_var_name or leave it out of vars_to_warm_start",
        "init_from_checkpoint": "map the table to a tensor the checkpoint holds",
    }[what]
    dim = var.shape[1]
    values = []
    with tf.name_scope(var.op.name + "/hybridtf_warm_start"):
        for key, offset, rows in sorted(parts, key=lambda p: p[1]):
            if key not in chosen:
                here = shard[0].local_slice(offset, rows, shard[1].rank) if shard else slice(offset, offset + rows)
                values.append(var.initial_value[here])
                continue
            source = prev_names.get(key, key)
            if source not in shapes:
                raise ValueError(
                    f"{what}: tensor {source!r} (table {key!r}) is not found in checkpoint {ckpt_file}; {fix}."
                )
            if shapes[source] != [rows, dim]:
                raise ValueError(
                    f"{what}: table {key!r} is {[rows, dim]} but checkpoint {ckpt_file} holds {source!r} as "
                    f"{shapes[source]}; the vocabulary size or embedding dim changed."
                )
            with tf.device("/cpu:0"):
                value = tf.raw_ops.RestoreV2(
                    prefix=ckpt_file, tensor_names=[source], shape_and_slices=[""], dtypes=[var.dtype.base_dtype]
                )[0]
            value.set_shape([rows, dim])
            values.append(shard[0].own_rows(value, offset, rows, shard[1].rank) if shard else value)
        value = tf.concat(values, axis=0)
    var._initializer_op = var.assign(value, read_value=False)
    var._initial_value = value

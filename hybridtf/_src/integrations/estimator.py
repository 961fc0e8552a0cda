"""``hybridtf.estimator.model_fn``: packed embeddings for a TF1-style Estimator model_fn.

An Estimator calls the model_fn once per graph (train, evaluate, predict,
export); the model_fn creates its variables and, in TRAIN mode, builds the
gradients and the train op itself. The packed chains must therefore exist
when the lookups are made. The wrapper runs the user's model_fn twice:

1. **Record pass, in a scratch graph** (never run), fed by placeholders shaped
   like the features and labels. A ``tf.variable_creator_scope`` finds the
   tables: every ``tf.keras.layers.Embedding`` / ``hybridtf.layers.EmbeddingBag``
   gets a ``CapturedTable`` for its ``embeddings`` (see ``estimator_capture``);
   ``hybridtf.embedding.Tables`` lookups are recorded through the capture
   context. Every lookup's ids, and every table's initial value, are noted.
2. **Planning and storage.** The layers' tables are planned like a Keras
   model's (``plan_packing``) and their packed variables are created in the
   real graph, initialized from copies of the tables' own initializers.
3. **Real pass.** The layers' ``embeddings`` are views of the packed
   variables (no per-table variable exists). At the first lookup of a runtime
   (the layers' ``PackedRuntime``, or one ``Tables`` set), the ops computing
   the ids of all its recorded lookups are copied from the scratch graph
   (fed by the real features) and ``lookup_all`` runs them with one chain per
   packed table; later lookups are served in recorded order. Lookups whose ids
   cannot be copied (e.g. Keras ``Input`` placeholders, stateful ops) run on
   their own, still on the packed variable.
4. **Checkpoints.** The returned spec's Scaffold gets a Saver that writes the
   plain model_fn's layout, crash-safe (``estimator_saver``); an Estimator's
   ``warm_start_from`` initializes packed tables per member table
   (``estimator_warm_start``).

A model_fn without anything to pack is then called once more, unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import sys

import tensorflow as tf
from tensorflow.python.framework import ops

from hybridtf._src.capture import context
from hybridtf._src.capture.context import CaptureError, LookupRequest
from hybridtf._src.capture.lookup_api import Tables
from hybridtf._src.integrations import estimator_capture as capture
from hybridtf._src.integrations import (
    estimator_columns,
    estimator_dynamic,
    estimator_horovod,
    estimator_step_watchdog,
    estimator_storage,
    estimator_updates,
    estimator_warm_start,
)
from hybridtf._src.integrations import estimator_graph as graph_util
from hybridtf._src.integrations import estimator_init_from_checkpoint as init_from_ckpt
from hybridtf._src.integrations.estimator_hooks import EstimatorReport, ShardBroadcastGuardHook, attach_report
from hybridtf._src.integrations.estimator_raw_tables import raw_owner
from hybridtf._src.integrations.estimator_record import Lookup, Record
from hybridtf._src.integrations.estimator_saver import crash_safe_default_saver, recorded_keys, with_saver
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.rewrite import dataflow_fusion, interleave
from hybridtf._src.rewrite.runtime import PackedRuntime, lookup_all


class _RuntimeOwner:
    """Stands for the layers in requests given to ``lookup_all`` (the layers' runtime)."""

    def __init__(self, runtime):
        self._htf_runtime = runtime


class _Real:
    """The real pass: packed storage, captured layers, served lookups."""

    def __init__(self, record: Record, plan: PackingPlan | None, real_graph):
        self.record = record
        self.graph = real_graph
        self.plan = plan
        self.op_map = graph_util.new_op_map(record.pairs)
        self.storage = None
        self.runtime = None
        self.claimed: dict[str, capture.CapturedTable] = {}
        self.tables_sets: list = []
        packed = set() if plan is None else {m.name for pt in plan.packed_tables for m in pt.members}
        self.packed_names = packed
        lookups = [lk for lk in record.lookups if lk.kind == "tables" or lk.request.table in packed]
        self.layer_lookups = [lk for lk in lookups if lk.kind == "layer"]
        self.tables_lookups = [lk for lk in lookups if lk.kind == "tables"]
        self.layer_position = 0
        self.outputs: dict[int, object] = {}  # id(Lookup) -> output
        self.own_chains: list[tuple] = []  # (table, why its ids cannot join the shared chain, output)
        self.done_groups: set = set()
        if packed:
            self.storage = estimator_storage.create(plan, record.variables, self.op_map, record.graph, real_graph)
            self.runtime = PackedRuntime(plan, self.storage)

    # -- variable creation ---------------------------------------------------------------------
    def creator(self, next_creator, **kwargs):
        tables = capture.tables_being_built()
        if tables is not None and not any(t is tables for t in self.tables_sets):
            self.tables_sets.append(tables)
        layer = estimator_columns.table_owner(kwargs) or raw_owner(kwargs, self.record.raw_tables)
        if layer is not None and layer.name not in self.record.tables and not self.record.was_skipped(layer.name):
            raise CaptureError(
                f"hybridtf.estimator: embedding table {layer.name!r} was created in the real pass but not in the "
                "record pass; the model_fn must build the same model every call."
            )
        if layer is None or layer.name not in self.packed_names or layer.name in self.claimed:
            return next_creator(**kwargs)
        spec = self.plan.table(layer.name)
        shape = tuple(capture.declared_shape(kwargs).as_list())
        if shape != (spec.num_rows, spec.dim):
            raise CaptureError(
                f"hybridtf.estimator: embedding layer {layer.name!r} is {shape} in the real pass but was "
                f"{(spec.num_rows, spec.dim)} in the record pass; the model_fn must build the same model every call."
            )
        key = capture.reserve_variable_name(kwargs.get("name"))
        packed_name, offset = self.plan.location(layer.name)
        view = capture.CapturedTable(
            self.storage.packed[packed_name], offset, spec.num_rows, layer.name, layer, key, self._layer_lookup
        )
        capture.capture_bag(layer)
        self.claimed[layer.name] = view
        return view

    # -- lookups -------------------------------------------------------------------------------
    def _layer_lookup(self, table, ids, combiner, aux=()):
        if ops.get_default_graph() is not self.graph:
            return None
        if self.layer_position >= len(self.layer_lookups):
            raise CaptureError(
                f"hybridtf.estimator: embedding table {table.table!r} was looked up in the real pass but not in the "
                "record pass; the model_fn's lookups must not depend on anything but its arguments."
            )
        lookup = self.layer_lookups[self.layer_position]
        if lookup.request.table != table.table:
            raise CaptureError(
                f"hybridtf.estimator: layer lookup #{self.layer_position} was table {lookup.request.table!r} in the "
                f"record pass but {table.table!r} in the real pass; the model_fn must build the same model every call."
            )
        self.layer_position += 1
        if lookup.problem is not None:  # ids computed in a way that cannot be copied: a chain of its own
            owner = _RuntimeOwner(self.runtime)
            out = self.runtime.lookup([LookupRequest(table.table, ids, combiner, owner=owner)])[0]
            self.own_chains.append((table.table, lookup.problem, out))
            return out, tuple(aux)
        if len(lookup.aux) != len(aux):
            raise CaptureError(
                f"hybridtf.estimator: the lookup of table {table.table!r} differs between the record and the real "
                "pass; the model_fn must build the same model every call."
            )
        return self._served(lookup), tuple(self._copied(list(lookup.aux)))

    def _copied(self, tensors: list) -> list:
        """The record graph's ``tensors`` (ids and what is computed with them) copied into the real graph."""
        return graph_util.copy_to_graph(tensors, self.op_map, self.record.graph, self.graph, "hybridtf_ids")

    def _real_owner(self, lookup: Lookup):
        if lookup.kind == "layer":
            return _RuntimeOwner(self.runtime)
        index = next(i for i, t in enumerate(self.record.tables_sets) if t is lookup.request.owner)
        if index >= len(self.tables_sets):
            raise CaptureError(
                f"hybridtf.estimator: a lookup of table {lookup.request.table!r} comes before its "
                "hybridtf.embedding.Tables was created in the real pass; the model_fn must build the same model "
                "every call."
            )
        return self.tables_sets[index]

    def _group_key(self, lookup: Lookup):  # one chain per packed table, runtime and micro-batch segment
        return ("layers" if lookup.kind == "layer" else id(lookup.request.owner), lookup.segment)

    def _served(self, lookup: Lookup):
        key = self._group_key(lookup)
        if key not in self.done_groups:
            self.done_groups.add(key)
            group = [
                lk
                for lk in self.layer_lookups + self.tables_lookups
                if self._group_key(lk) == key and lk.problem is None
            ]
            requests = []
            for lk in group:
                parts = tf.nest.flatten(lk.request.ids, expand_composites=True)
                ids = tf.nest.pack_sequence_as(lk.request.ids, self._copied(parts), expand_composites=True)
                requests.append(dataclasses.replace(lk.request, ids=ids, owner=self._real_owner(lk)))
            with tf.name_scope(self.graph.unique_name("hybridtf_packed_lookups") + "/"):
                for lk, out in zip(group, lookup_all(requests)):
                    self.outputs[id(lk)] = out
        return self.outputs[id(lookup)]

    def check_done(self):
        missing = sorted(self.packed_names - set(self.claimed))
        if missing:
            raise CaptureError(
                f"hybridtf.estimator: embedding table(s) {missing} were created in the record pass but not in the "
                "real pass; the model_fn must build the same model every call."
            )
        if self.layer_position != len(self.layer_lookups):
            raise CaptureError(
                f"hybridtf.estimator: the model_fn made {self.layer_position} embedding layer lookups in the real "
                f"pass but {len(self.layer_lookups)} in the record pass; lookups must not depend on anything but "
                "the model_fn's arguments."
            )


class _TablesRequests:
    """The replay context's expected requests: recorded ``Tables`` lookups, owners mapped to real objects."""

    def __init__(self, real: _Real):
        self._real = real

    def __len__(self):
        return len(self._real.tables_lookups)

    def __getitem__(self, index):
        lookup = self._real.tables_lookups[index]
        return dataclasses.replace(lookup.request, owner=self._real._real_owner(lookup))


class _TablesOutputs:
    def __init__(self, real: _Real):
        self._real = real

    def __getitem__(self, index):
        lookup = self._real.tables_lookups[index]
        if ops.get_default_graph() is not self._real.graph:
            raise CaptureError(
                f"hybridtf.estimator: the lookup of table {lookup.request.table!r} runs inside tf.cond, "
                "tf.while_loop or a tf.function; hybridtf.embedding.Tables lookups must be at the top level."
            )
        return self._real._served(lookup)


def _user_args(user_fn) -> set:
    try:
        return set(inspect.signature(user_fn).parameters)
    except (TypeError, ValueError):
        return {"features", "labels", "mode", "params", "config"}


def _exporting() -> bool:
    """Whether an Estimator's SavedModel export calls the model_fn (``export_saved_model``,
    ``experimental_export_all_saved_models``, exporters: each mode's graph is built by the Estimator's
    ``_add_meta_graph_for_mode``)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_add_meta_graph_for_mode" and isinstance(
            frame.f_locals.get("self"), tf.estimator.Estimator
        ):
            return True
        frame = frame.f_back
    return False


def _mode_name(mode) -> str:
    return str(mode) if mode is not None else "unknown"


def _own_params(kwargs: dict) -> dict:
    """``kwargs`` with a deep copy of ``params``: each call of the model_fn gets its own, as Estimator gives
    each model_fn call (a model_fn that changes its params, e.g. ``params.pop``, must not see the record
    pass's change in the real pass)."""
    if kwargs.get("params") is None:
        return kwargs
    return {**kwargs, "params": copy.deepcopy(kwargs["params"])}


def build(
    user_fn,
    features,
    labels,
    mode,
    params,
    config,
    *,
    exclude=(),
    max_shards=None,
    plan=None,
    interleave_groups=None,
    interleave_exclude=(),
):
    """Builds the wrapped model_fn's graph in the default graph; returns the EstimatorSpec."""
    wanted = _user_args(user_fn)
    kwargs = {"features": features}
    if "labels" in wanted:
        kwargs["labels"] = labels
    elif labels is not None:
        raise ValueError("the model_fn does not take labels, but the input_fn returned labels.")
    for name, value in (("mode", mode), ("params", params), ("config", config)):
        if name in wanted:
            kwargs[name] = value
    real_graph = tf.compat.v1.get_default_graph()
    record = Record(real_graph)
    record.run(user_fn, _own_params(kwargs), real_graph)
    raw_tables, raw_notes = record.raw_tables_found()
    if raw_tables:  # the model_fn's own variables looked up as tables: run again, capturing them
        record = Record(real_graph, raw_tables)
        record.run(user_fn, _own_params(kwargs), real_graph)
    record.note_skipped(raw_notes)
    for lookup in record.lookups:
        if lookup.kind == "tables" and lookup.problem is not None:
            raise CaptureError(
                f"hybridtf.estimator: the ids of the lookup of table {lookup.request.table!r} cannot be computed "
                f"before the model_fn's first lookup: {lookup.problem}. Compute ids in the input_fn (or from the "
                "features with stateless ops)."
            )
    groups = estimator_updates.update_groups(record.variables)
    specs = [
        capture.table_spec(name, info.variable, info.view.layer, groups[name]) for name, info in record.tables.items()
    ]
    if specs:
        if plan is None:
            if max_shards is None:
                max_shards = 8 if tf.config.list_physical_devices("GPU") else 1
            plan = plan_packing(specs, exclude=tuple(exclude), max_shards=max_shards)
        record.skipped.extend((u.name, u.reason) for u in plan.unpacked)
        if not plan.packed_tables:
            plan = None
    else:
        plan = None
    report = EstimatorReport(
        _mode_name(mode),
        packed=plan is not None or any(lk.kind == "tables" for lk in record.lookups),
        plan=plan,
        skipped=list(record.skipped),
        unpacked_lookups=record.unpacked_lookups(),
    )
    report.warn_unpacked()
    scratch_ops = graph_util.step_ops(_step_fetches(record.spec))
    # PREDICT (predict, export_saved_model) runs the plain model_fn with plain lookups: its tables are the
    # plain variables the checkpoint holds (plain layout), so an export serves without hybridtf ops. Not for
    # functional Tables lookups, which exist only packed; dynamic tables are read from the checkpoint's ids
    # and rows (caching/serving.GraphServingRows). An export's EVAL and TRAIN graphs
    # (experimental_export_all_saved_models) likewise, without dynamic tables (which train and evaluate only
    # through hybridtf's ops): they held hybridtf's ops, which a process without hybridtf cannot load.
    plain_graph = not any(lk.kind == "tables" for lk in record.lookups) and (
        mode == tf.estimator.ModeKeys.PREDICT or (_exporting() and not estimator_dynamic.dynamic_owners(record.graph))
    )
    if not report.packed or plain_graph:
        if plain_graph:  # the graph runs the plain model_fn: nothing in it is packed
            report.packed, report.plan = False, None
        with context.plain_ops() if plain_graph else contextlib.nullcontext():
            spec = user_fn(**_own_params(kwargs))
        spec = estimator_dynamic.finish(spec, real_graph, mode, report, config)
        estimator_horovod.check_save_schedule(real_graph, config, mode)
        estimator_horovod.check_same_start(real_graph, config, mode)
        if not plain_graph:  # plain lookups read the rank's own checkpoint: no collective
            spec = estimator_step_watchdog.guard_steps(spec, real_graph, mode)
        spec = crash_safe_default_saver(spec, config)  # restores clean what killed saves left, as packed graphs'
        report.step_ops_plain = report.step_ops_packed = graph_util.step_ops(_step_fetches(spec))
        report.batch_size = graph_util.batch_size_tensor(features)
        attach_report(real_graph, report)
        return spec
    real = _Real(record, plan, real_graph)
    if real.runtime is not None and interleave_groups is not None:  # K-interleaving groups
        groups = interleave.static_plan(plan, interleave_groups, interleave_exclude)
        real.runtime.interleaving = groups if groups.num_groups > 1 else None
        report.interleaving = real.runtime.interleaving
    shared = {pt.name for pt in plan.packed_tables if len(pt.members) > 1} if plan is not None else set()
    packed_once = estimator_updates.each_packed_variable_once(real.storage.packed if real.storage else {}, shared)
    packed_tables = {m.name for pt in plan.packed_tables for m in pt.members} if plan is not None else set()
    init_noted = {t: source for t, source in record.init_noted.items() if t in packed_tables}
    from_checkpoint = init_from_ckpt.intercepted(init_from_ckpt.real_pass_table(packed_tables), init_noted)
    with (
        tf.variable_creator_scope(real.creator),
        context.replaying([], []) as rep,
        packed_once,
        from_checkpoint,
        dataflow_fusion.fusing(forward_only=True) as fusions,
    ):
        rep.requests = _TablesRequests(real)
        rep.outputs = _TablesOutputs(real)
        try:
            spec = user_fn(**_own_params(kwargs))
        except (CaptureError, tf.errors.OpError):
            raise
        except Exception as error:  # it ran in the record pass: the packed variables are what differs
            if real.storage is None:
                raise
            raise estimator_updates.real_pass_error(error, real.storage.packed) from error
    real.check_done()
    capture.settle_collections(real_graph)
    if real.storage is not None:
        estimator_updates.check_updates(plan, real.storage.packed, record.variables)
        estimator_updates.check_loss_reads(
            plan, real.storage.packed, record.variables, getattr(record.spec, "loss", None), getattr(spec, "loss", None)
        )
        sharded = {name for name, layout in real.storage.layouts.items() if layout is not None}
        estimator_horovod.check_shards_stay_local(real.storage.packed, sharded)
        if mode == tf.estimator.ModeKeys.TRAIN:
            estimator_updates.warn_clipped_tables(plan, real.storage.packed)
            estimator_horovod.warn_unaveraged_dense(real.storage.packed, real.storage.world)
            if sharded:  # refuses Horovod's own broadcast hook, which would overwrite the shards
                spec = spec._replace(training_hooks=(*spec.training_hooks, ShardBroadcastGuardHook()))
    spec = estimator_dynamic.finish(spec, real_graph, mode, report, config)
    estimator_horovod.check_save_schedule(real_graph, config, mode)
    estimator_horovod.check_same_start(real_graph, config, mode)
    spec = estimator_step_watchdog.guard_steps(spec, real_graph, mode)
    if real.storage is not None:
        packed = {v.op.name: v for v in real.storage.packed.values()}
        members = {}
        for pt in plan.packed_tables:
            var = real.storage.packed[pt.name]
            members[var.op.name] = [(real.claimed[m.name].checkpoint_key, m.row_offset, m.num_rows) for m in pt.members]
        shards = {
            real.storage.packed[name].op.name: (layout, real.storage.world)
            for name, layout in real.storage.layouts.items()
            if layout is not None
        }
        plain = {
            real.claimed[name].checkpoint_key: var for name, var in record.variables.items() if name in real.claimed
        }
        recorded = recorded_keys(record.spec, record.graph, plain)
        spec, _ = with_saver(spec, packed, members, config, shards, recorded)
        keys = {m.name: real.claimed[m.name].checkpoint_key for pt in plan.packed_tables for m in pt.members}
        init_from_ckpt.apply(init_noted, packed, members, keys, shards)
        estimator_warm_start.apply(packed, members, shards, mode)  # after: TensorFlow warm-starts after the model_fn
    step = graph_util.step_op_set(_step_fetches(spec))
    # (a Keras functional model's construction call on its Input placeholders runs a chain of its own too: not
    # part of the step)
    report.own_chain_lookups = [
        (table, why)
        for table, why, out in real.own_chains
        if tf.nest.flatten(out, expand_composites=True)[0].op in step
    ]
    report.fusions = fusions.log if fusions is not None else None
    report.packed_lookups = len(real.outputs) + len(report.own_chain_lookups)
    report.tables_lookups = sum(1 for lk in real.tables_lookups if id(lk) in real.outputs)
    report.step_ops_plain = scratch_ops
    report.step_ops_packed = len(step)
    report.batch_size = graph_util.batch_size_tensor(features)
    attach_report(real_graph, report)
    return spec


def _step_fetches(spec):
    if spec is None:
        return []
    if getattr(spec, "train_op", None) is not None:
        return [spec.train_op, spec.loss]
    fetches = [spec.loss] if getattr(spec, "loss", None) is not None else []
    predictions = getattr(spec, "predictions", None)
    if predictions is not None:
        fetches.extend(tf.nest.flatten(predictions))
    return fetches


def model_fn(
    user_model_fn=None,
    *,
    exclude=(),
    max_shards: int | None = None,
    plan: PackingPlan | None = None,
    interleave_groups=None,
    interleave_exclude=(),
):
    """Wraps an Estimator model_fn so that its embedding lookups run packed.

    The returned model_fn builds the same model (same variables, same math)
    with the lookups of ``tf.keras.layers.Embedding`` and
    ``hybridtf.layers.EmbeddingBag`` layers created inside the model_fn
    packed into a few tables (D-packing, as ``hybridtf.keras.optimize``), and
    all lookups of a step — including ``hybridtf.embedding.Tables`` lookups —
    computed by one fused chain per packed table (K-packing). Use it with
    ``tf.estimator.Estimator`` (train / evaluate / predict /
    export_saved_model) or call it yourself in a ``tf.compat.v1`` graph.
    Checkpoints keep the plain model_fn's variable names, so they restore into
    the un-wrapped model_fn's Estimator and the other way round.

    The user's model_fn runs twice per graph: a record pass in a scratch
    graph (never run; Python side effects happen twice) and the real pass.
    It must build the same model from the same arguments both times. A
    model_fn without anything to pack runs unchanged (``hooks()`` says so).

    Args:
        user_model_fn: ``model_fn(features, labels, mode, params, config)``
            (any subset of these arguments, as Estimator allows). Omit to use
            ``model_fn(exclude=...)`` as a decorator.
        exclude: embedding layer names to leave unpacked.
        max_shards: at most this many shards per D-packing group (default: 8
            with a GPU, else 1), as in ``hybridtf.keras.optimize``.
        plan: a packing plan of the model_fn's embedding layers to use as it is.
        interleave_groups: K-interleaving: a number of groups (balanced by
            CalcVParam) or an ``InterleavingPlan``; each group's chain stages
            run after the previous group's (same results). None: off.
        interleave_exclude: embedding tables whose chains get no control
            dependencies.

    Returns:
        A model_fn for ``tf.estimator.Estimator``.

    Raises:
        TypeError: ``user_model_fn`` is not callable.
        hybridtf.errors.CaptureError: (when the Estimator builds a graph) the
            model_fn builds different models in its two passes, a
            ``Tables`` lookup runs inside control flow or has ids computed
            with side effects, or a table's initializer reads a variable;
            the message names the table and the fix.

    Example:
        >>> def my_model_fn(features, labels, mode):
        ...     emb = tf.keras.layers.Embedding(1000, 8, name="emb_user")(features["user"])
        ...     ...
        ...     return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
        >>> est = tf.estimator.Estimator(hybridtf.estimator.model_fn(my_model_fn), model_dir)
        >>> est.train(input_fn, steps=1000, hooks=hybridtf.estimator.hooks())
    """
    if user_model_fn is None:
        return lambda fn: model_fn(
            fn,
            exclude=exclude,
            max_shards=max_shards,
            plan=plan,
            interleave_groups=interleave_groups,
            interleave_exclude=interleave_exclude,
        )
    if not callable(user_model_fn):
        raise TypeError(f"hybridtf.estimator.model_fn takes a callable model_fn, got {type(user_model_fn).__name__}.")
    exclude = tuple(exclude)

    options = dict(
        exclude=exclude,
        max_shards=max_shards,
        plan=plan,
        interleave_groups=interleave_groups,
        interleave_exclude=tuple(interleave_exclude),
    )
    if "params" in _user_args(user_model_fn):

        def wrapped_model_fn(features, labels=None, mode=None, params=None, config=None):
            with context.wrapped_model_fn():
                return build(user_model_fn, features, labels, mode, params, config, **options)

    else:  # Estimator warns when a model_fn takes params it is not given

        def wrapped_model_fn(features, labels=None, mode=None, config=None):
            with context.wrapped_model_fn():
                return build(user_model_fn, features, labels, mode, None, config, **options)

    wrapped_model_fn.__name__ = getattr(user_model_fn, "__name__", "model_fn")
    wrapped_model_fn.__doc__ = getattr(user_model_fn, "__doc__", None)
    wrapped_model_fn.hybridtf_wrapped = user_model_fn
    return wrapped_model_fn


__all__ = ["Tables", "build", "model_fn"]

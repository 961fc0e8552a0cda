"""The record pass of ``hybridtf.estimator.model_fn``: the user's model_fn in a scratch graph.

It runs the model_fn once, never executed, fed by placeholders shaped like the features and labels
(``estimator_graph.stand_in_inputs``). A ``tf.variable_creator_scope`` finds the tables (Keras
Embedding / EmbeddingBag layers, feature columns: ``estimator_columns.table_owner``) and gives each
a ``CapturedTable`` over its own variable; ``Tables`` lookups join through the capture context.
Every lookup's ids (and the tensors computed with them, ``aux``) are noted with why they could not
be copied into the real graph, if so; the real pass (``estimator._Real``) copies and serves them.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.python.framework import ops

from hybridtf._src.capture import context
from hybridtf._src.capture.context import RUNS_LOOKUPS_ATTR, LookupRequest
from hybridtf._src.integrations import estimator_capture as capture
from hybridtf._src.integrations import (
    estimator_columns,
    estimator_dynamic,
    estimator_optimizer_state,
    estimator_raw_tables,
    estimator_updates,
)
from hybridtf._src.integrations import estimator_graph as graph_util
from hybridtf._src.integrations import estimator_init_from_checkpoint as init_from_ckpt
from hybridtf._src.rewrite.micro_batch_fn import current_segment


@dataclasses.dataclass
class Lookup:
    """One recorded lookup."""

    request: LookupRequest  # ids in the scratch graph, owner a scratch object
    kind: str  # "layer" | "tables"
    graph: object
    problem: str | None = None  # why its ids cannot be copied into the real graph
    aux: tuple = ()  # tensors computed with the ids (scratch graph), copied with them (CapturedTable.lookup)
    segment: object = dataclasses.field(default_factory=current_segment)  # micro-batch (micro_batch_gradients)


@dataclasses.dataclass
class TableInfo:
    view: capture.CapturedTable
    variable: tf.Variable


class _RecordedRequests(list):
    """The capture context's request list in the record pass: ``Tables`` lookups join the pass's lookups."""

    def __init__(self, record):
        super().__init__()
        self._record = record

    def append(self, request):
        self._record.lookups.append(Lookup(request, "tables", ops.get_default_graph()))
        super().append(request)


class Record:
    """The record pass: runs the model_fn in a scratch graph and notes tables, lookups and Tables sets."""

    def __init__(self, real_graph, raw_tables=frozenset()):
        self.graph = tf.Graph()
        self.graph.seed = real_graph.seed
        self.tables: dict[str, TableInfo] = {}
        self.skipped: list[tuple[str, str]] = []
        self.lookups: list[Lookup] = []
        self.tables_sets: list = []
        self.pairs: list = []
        self.spec = None
        self.init_noted: dict = {}  # table -> (checkpoint, tensor) of the model_fn's init_from_checkpoint
        self.skipped_variables: set[str] = set()
        self.raw_tables = frozenset(raw_tables)  # variables of the model_fn's own captured as tables
        self.raw_candidates: dict[str, tf.Variable] = {}  # full name -> variable (estimator_raw_tables)

    def run(self, user_fn, kwargs, real_graph):
        with self.graph.as_default():
            if tf.compat.v1.train.get_global_step(real_graph) is not None:
                tf.compat.v1.train.get_or_create_global_step()
            args = dict(kwargs)
            for key in ("features", "labels"):
                if key in args:
                    args[key], pairs = graph_util.stand_in_inputs(args[key], f"hybridtf_record_{key}")
                    self.pairs.extend(pairs)
            views_as_variables = estimator_updates.each_packed_variable_once({}, set())
            from_checkpoint = init_from_ckpt.intercepted(
                init_from_ckpt.record_pass_table(lambda: self.variables), self.init_noted
            )
            with (
                tf.variable_creator_scope(self._creator),
                context.recording() as rec,
                views_as_variables,
                from_checkpoint,
                estimator_optimizer_state.untouched(self.graph),
            ):
                rec.requests = _RecordedRequests(self)
                setattr(rec, RUNS_LOOKUPS_ATTR, True)
                self.spec = user_fn(**args)
        for name, info in list(self.tables.items()):
            if info.view.dense_use is not None:
                self.skipped.append((name, info.view.dense_use))
                self.skipped_variables.add(info.variable.op.name)  # reported once, with that reason
                del self.tables[name]
        op_map = graph_util.new_op_map(self.pairs)
        for lookup in self.lookups:
            if lookup.graph is not self.graph:
                lookup.problem = "it runs in another graph (tf.cond / tf.while_loop / tf.function)"
                continue
            parts = [t for t in tf.nest.flatten(lookup.request.ids, expand_composites=True)]
            lookup.problem = graph_util.liftable_problem(parts, op_map)

    def _creator(self, next_creator, **kwargs):
        tables = capture.tables_being_built()
        if tables is not None and not any(t is tables for t in self.tables_sets):
            self.tables_sets.append(tables)
        layer = estimator_columns.table_owner(kwargs) or estimator_raw_tables.raw_owner(kwargs, self.raw_tables)
        if isinstance(layer, estimator_raw_tables.RawTable):
            kwargs["use_resource"] = True  # a reference variable's (use_resource=False) scratch stand-in
        if layer is None:
            variable = next_creator(**kwargs)
            if estimator_raw_tables.is_candidate(kwargs):
                self.raw_candidates.setdefault(estimator_raw_tables.full_name(kwargs), variable)
            return variable
        variable = next_creator(**kwargs)
        reason = capture.unsupported_reason(layer, kwargs)
        if reason is None and layer.name in self.tables:
            reason = f"another embedding layer is also named {layer.name!r}; give layers unique names"
        if reason is not None:
            self.skipped.append((layer.name, reason))
            self.skipped_variables.add(variable.op.name)  # reported once, with that reason
            return variable
        rows = int(variable.shape[0])
        view = capture.CapturedTable(variable, 0, rows, layer.name, layer, variable.op.name, self._lookup)
        capture.capture_bag(layer)
        self.tables[layer.name] = TableInfo(view, variable)
        return view

    def _lookup(self, table, ids, combiner, aux=()):
        if ops.get_default_graph() is not self.graph:
            return None  # e.g. Keras functional construction: plain lookup, not recorded
        self.lookups.append(Lookup(table.request(ids, combiner), "layer", self.graph, aux=tuple(aux)))
        return None  # the plain lookup on the table's own variable

    def raw_tables_found(self) -> tuple[frozenset, list]:
        """The model_fn's own variables that its graph reads only by rows (tables to capture in a second run),
        and ``(name, reason)`` of those read only by rows that stay unpacked (frozen, or in control flow)."""
        found, notes = set(), []
        for name, var in self.raw_candidates.items():
            use = estimator_raw_tables.table_use(var)
            if use == estimator_raw_tables.CONTROL_FLOW:
                notes.append((name, estimator_raw_tables.CONTROL_FLOW_REASON))
            elif use == estimator_raw_tables.LOOKUP and not var.trainable:
                notes.append((name, "frozen (trainable=False) tables are not packed"))
            elif use == estimator_raw_tables.LOOKUP:
                found.add(name)
        return frozenset(found), notes

    def note_skipped(self, notes: list) -> None:
        """Reports ``(variable name, reason)`` as tables left unpacked (once: not also as unpacked lookups)."""
        self.skipped.extend(notes)
        self.skipped_variables.update(name for name, _ in notes)

    def was_skipped(self, table: str) -> bool:
        """Whether the record pass met ``table`` and left it unpacked (with the reason)."""
        return any(name == table for name, _ in self.skipped)

    @property
    def variables(self) -> dict:
        """Table name -> the table's own variable in the scratch graph."""
        return {name: info.variable for name, info in self.tables.items()}

    def unpacked_lookups(self) -> list[str]:
        """Trainable variables looked up in the scratch graph (gathered from, or reduced by sparse segments) that
        hybridtf does not manage (not optimizer slots, which a Keras optimizer's sparse update gathers from)."""
        trainable = {v.op.name for v in self.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        known = {info.variable.op.name for info in self.tables.values()} | self.skipped_variables
        for tables in self.tables_sets:
            known.update(v.op.name for v in tables.variables)
        known.update(o._rows_buffer.op.name for o in estimator_dynamic.dynamic_owners(self.graph))
        found = []
        for op in self.graph.get_operations():
            if op.type not in ("ResourceGather", "GatherV2") and op.type not in estimator_raw_tables.SEGMENT_REDUCTIONS:
                continue
            src = op.inputs[0].op
            if src.type == "ReadVariableOp":
                src = src.inputs[0].op
            if src.type == "VarHandleOp" and src.name in trainable and src.name not in known and src.name not in found:
                found.append(src.name)
        return found


__all__ = ["Lookup", "Record", "TableInfo"]

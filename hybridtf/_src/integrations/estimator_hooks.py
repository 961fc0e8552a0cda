"""What a wrapped model_fn reports about its graph, and hybridtf's SessionRunHooks.

The wrapped model_fn attaches an ``EstimatorReport`` to the graph it built;
the hooks read it in ``begin`` (Estimator and MonitoredTrainingSession call
``begin`` with that graph as the default graph).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError

_REPORT_ATTR = "_hybridtf_estimator_report"

#: Graph collection of the ops that keep hybridtf's caches consistent: the flush of every dynamic
#: (HybridHash) table the wrapped model_fn created; ``CacheMaintenanceHook`` runs them.
CACHE_MAINTENANCE = "hybridtf_cache_maintenance"

_log = logging.getLogger("hybridtf")


@dataclasses.dataclass
class EstimatorReport:
    """What ``hybridtf.estimator.model_fn`` did to one graph.

    Attributes:
        mode: the ``tf.estimator.ModeKeys`` value the graph was built for.
        packed: whether any lookup was packed (False: the model_fn ran unchanged).
        plan: the packing plan of the model_fn's Embedding / EmbeddingBag tables (or None).
        packed_lookups: lookups computed by packed chains.
        tables_lookups: of those, lookups of ``hybridtf.embedding.Tables``.
        own_chain_lookups: of those, ``(table, reason)`` of the lookups that run a packed chain of
            their own rather than the step's shared one: their ids come from ops that cannot be
            copied ahead of the model_fn (a vocabulary column's hash table, ``tf.py_function``, ...).
        unpacked_lookups: gathers on variables hybridtf does not manage
            (``tf.nn.embedding_lookup`` on own variables, partitioned feature columns, ...).
        skipped: ``(table, reason)`` of embedding layers left as they are.
        step_ops_plain: ops the step of the un-wrapped model_fn can run.
        step_ops_packed: ops the step of this graph can run.
        batch_size: int64 scalar tensor, examples in one step (or None).
        dynamic_tables: dynamic (HybridHash) table name -> its statistics op
            (an int64 vector in ``caching.table.STAT_NAMES`` order).
        interleaving: the K-interleaving plan of the packed chains (groups,
            Capacity_g, members, excluded tables), or None (one group).
        fusions: what the forward pass fused (``dataflow_fusion.FusionLog``: concatenations and sums
            of looked-up fields, the dense layer on them, ...), or None.
    """

    mode: str
    packed: bool
    plan: Any = None
    packed_lookups: int = 0
    tables_lookups: int = 0
    own_chain_lookups: list = dataclasses.field(default_factory=list)
    unpacked_lookups: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    step_ops_plain: int = 0
    step_ops_packed: int = 0
    batch_size: Any = None
    dynamic_tables: dict = dataclasses.field(default_factory=dict)
    interleaving: Any = None
    fusions: Any = None

    def summary(self) -> str:
        """One paragraph for logs."""
        lines = []
        if not self.packed and self.dynamic_tables:
            lines.append("hybridtf: no fixed-vocabulary embedding lookups to pack in this model_fn.")
        elif not self.packed and self.skipped:
            lines.append(
                f"hybridtf: nothing packed in this model_fn: its {len(self.skipped)} embedding table(s) stay unpacked "
                "(each reason below); it runs unchanged."
            )
        elif not self.packed:
            lines.append(
                "hybridtf: nothing to pack in this model_fn (no hybridtf.embedding.Tables lookups, no packable "
                "tf.keras.layers.Embedding / hybridtf.layers.EmbeddingBag / feature column, no variable only looked "
                "up); it runs unchanged."
            )
        else:
            chains = self.plan.num_lookup_chains if self.plan is not None else 0
            lines.append(
                f"hybridtf: {self.packed_lookups} embedding lookups packed ({self.tables_lookups} of them "
                f"hybridtf.embedding.Tables lookups); layer tables: {chains} packed chain(s); step ops: plain "
                f"{self.step_ops_plain} -> hybridtf {self.step_ops_packed}."
            )
        fused = self._fused()
        if fused:
            lines.append(f"hybridtf: fused {fused}.")
        if self.own_chain_lookups:
            tables = ", ".join(repr(t) for t, _ in self.own_chain_lookups[:10])
            more = f" and {len(self.own_chain_lookups) - 10} more" if len(self.own_chain_lookups) > 10 else ""
            lines.append(
                f"hybridtf: {len(self.own_chain_lookups)} of those lookups ({tables}{more}) run a packed chain of "
                f"their own, not the step's shared one, because their ids cannot be computed ahead of the model_fn: "
                f"{self.own_chain_lookups[0][1]} (a vocabulary column's hash table, a tf.py_function, ...). Exact, "
                "but each runs its own unique, gather and stitch; to join the shared chain, compute such ids in the "
                "input_fn (e.g. map strings to ids there) or from the features with stateless ops."
            )
        if self.dynamic_tables:
            lines.append(
                f"hybridtf: {len(self.dynamic_tables)} dynamic (HybridHash) table(s): "
                f"{', '.join(map(repr, self.dynamic_tables))}."
            )
        if self.interleaving is not None:
            lines.append(f"hybridtf: {self.interleaving}")
        for name, reason in self.skipped:
            lines.append(f"hybridtf: table {name!r} not packed: {reason}.")
        if self.unpacked_lookups:
            shown = ", ".join(repr(v) for v in self.unpacked_lookups[:10])
            columns = any("/embedding_weights" in v or v.startswith("linear_model/") for v in self.unpacked_lookups)
            lines.append(
                f"hybridtf: lookups on {len(self.unpacked_lookups)} variable(s) hybridtf does not manage are left as "
                f"they are ({shown}); "
                + (
                    "feature-column tables created through a variable_scope partitioner (PartitionedVariable parts) "
                    "are not packed: drop the partitioner to pack them, or "
                    if columns
                    else ""
                )
                + "a variable of the model_fn's own packs when the model_fn only looks it up (tf.nn.embedding_lookup, "
                "tf.gather, tf.nn.(safe_)embedding_lookup_sparse: no other read, no partitioner, no constraint, "
                "float32 [rows, dim]); or write them with hybridtf.embedding.Tables, tf.keras.layers.Embedding or "
                "hybridtf.layers.EmbeddingBag to pack them."
            )
        return "\n".join(lines)

    def _fused(self) -> str:
        """``"2 concatenation(s) / sum(s), 1 dense layer(s)"``: what the forward pass fused, or ""."""
        log = self.fusions
        if log is None:
            return ""
        kinds = (
            (log.concats, "concatenation(s) / sum(s) of looked-up fields"),
            (log.dense, "dense layer(s) on them"),
            (log.fm, "factorization-machine term(s)"),
            (log.outer_products, "outer product(s)"),
            (log.attention, "attention input(s)"),
            (log.dice, "Dice activation(s)"),
        )
        return ", ".join(f"{len(names)} {what}" for names, what in kinds if names)

    def warn_unpacked(self) -> None:
        """One warning (training graphs) when tables or lookups were left unpacked, with the reasons and fixes."""
        if self.mode != tf.estimator.ModeKeys.TRAIN or not (self.skipped or self.unpacked_lookups):
            return
        lines = [line for line in self.summary().splitlines() if "not packed" in line or "does not manage" in line]
        _log.warning("hybridtf.estimator.model_fn left embedding lookups unpacked:\n%s", "\n".join(lines))


def attach_report(graph: tf.Graph, report: EstimatorReport) -> None:
    setattr(graph, _REPORT_ATTR, report)


def report_of(graph: tf.Graph | None = None) -> EstimatorReport | None:
    """The report of the wrapped model_fn that built ``graph`` (default graph), or None.

    Example:
        >>> report_of(tf.compat.v1.get_default_graph())
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    return getattr(graph, _REPORT_ATTR, None)


class StatsHook(tf.compat.v1.train.SessionRunHook):
    """Logs hybridtf's statistics: what was packed (at ``begin``), steps/s, examples/s and dynamic tables.

    Every N steps and at the end it logs throughput and, for each dynamic
    (HybridHash) table of the wrapped model_fn, one line: hot-tier hit ratio
    of the last step and cumulative, table size, hot rows used, inserts,
    evictions and flushes (read after the step, in a separate run).

    Args:
        every_n_steps: log throughput every this many steps (None: only at the end).
        batch_size: examples per step; default: read from the wrapped
            model_fn's features each step (needed for graphs not built by
            ``hybridtf.estimator.model_fn`` to count examples).
        log_fn: where lines go (default: the ``hybridtf`` logger at INFO).

    Attributes:
        report: the graph's ``EstimatorReport`` (None when not built by the wrapper).
        message: the line(s) logged at ``begin``.
        steps, examples: counted so far.
        dynamic: dynamic table name -> its latest metrics
            (``caching.stats.summarize``: hit_ratio, hit_ratio_cumulative,
            size, hot_used, inserts, evictions, flushes, ...).

    Example:
        >>> hook = StatsHook(every_n_steps=100)
        >>> estimator.train(input_fn, steps=1000, hooks=[hook])
        >>> hook.stats()["examples_per_sec"]
        >>> hook.stats()["dynamic_tables"]["user"]["hit_ratio"]
    """

    def __init__(self, every_n_steps: int | None = 100, batch_size: int | None = None, log_fn=None):
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps <= 0):
            raise ValueError(f"every_n_steps must be a positive int or None, got {every_n_steps!r}.")
        self._every = every_n_steps
        self._batch_size = batch_size
        self._log = log_fn or _log.info
        self.report = None
        self.message = ""
        self.steps = 0
        self.examples = 0
        self._start = None
        self._elapsed = 0.0
        self._fetch = None
        self._dynamic_fetch = {}
        self.dynamic = {}

    def begin(self):
        self.report = report_of()
        if self.report is None:
            self.message = (
                "hybridtf: nothing packed in this graph: it was not built by hybridtf.estimator.model_fn "
                "(lookups run as written)."
            )
        else:
            self.message = self.report.summary()
        self._fetch = None
        if self._batch_size is None and self.report is not None:
            self._fetch = self.report.batch_size
        self._dynamic_fetch = dict(self.report.dynamic_tables) if self.report is not None else {}
        self.dynamic = {}
        self._log(self.message)

    def before_run(self, run_context):
        if self._start is None:
            self._start = time.perf_counter()
        if self._fetch is not None:
            return tf.compat.v1.train.SessionRunArgs(self._fetch)
        return None

    def after_run(self, run_context, run_values):
        self.steps += 1
        if self._batch_size is not None:
            self.examples += int(self._batch_size)
        elif self._fetch is not None:
            self.examples += int(run_values.results)
        self._elapsed = time.perf_counter() - self._start
        if self._every is not None and self.steps % self._every == 0:
            self._log(self._throughput())
            self._log_dynamic(run_context.session)

    def end(self, session):
        if self.steps:
            self._log(self._throughput() + " (end)")
            self._log_dynamic(session)

    def _log_dynamic(self, session):
        if not self._dynamic_fetch:
            return
        from hybridtf._src.caching.stats import format_line, summarize

        values = session.run(self._dynamic_fetch)
        for name, vector in values.items():
            self.dynamic[name] = summarize(vector)
            self._log(format_line(name, self.dynamic[name]))

    def stats(self) -> dict:
        """Counters and rates so far (rates over the time since the first step started)."""
        elapsed = max(self._elapsed, 1e-9)
        return {
            "steps": self.steps,
            "examples": self.examples,
            "steps_per_sec": self.steps / elapsed if self.steps else 0.0,
            "examples_per_sec": self.examples / elapsed if self.steps else 0.0,
            "packed": bool(self.report and self.report.packed),
            "step_ops_plain": self.report.step_ops_plain if self.report else None,
            "step_ops_packed": self.report.step_ops_packed if self.report else None,
            "dynamic_tables": {name: dict(m) for name, m in self.dynamic.items()},
        }

    def _throughput(self) -> str:
        s = self.stats()
        text = f"hybridtf: {s['steps']} steps, {s['steps_per_sec']:.2f} steps/s"
        if self._fetch is not None or self._batch_size is not None:
            text += f", {s['examples_per_sec']:.1f} examples/s"
        return text


class CacheMaintenanceHook(tf.compat.v1.train.SessionRunHook):
    """Runs the graph's cache maintenance ops (collection ``CACHE_MAINTENANCE``) every N steps and at the end.

    The collection holds the flush of every dynamic (HybridHash) table the
    wrapped model_fn created: write the hot tier back, refill it with the
    top-k rows by frequency now (Algorithm 1, lines 23-26; values never
    change). Algorithm 1's own schedule (warm-up, then every ``flush_every``
    steps) runs inside the train op: each table's fused update ends the
    table's step, so a train op alone trains exactly and flushes on time.
    This hook adds flushes besides: every ``every_n_steps`` (to refresh the
    hot set more often than ``flush_every``, e.g. under drift) and when
    training ends (the final statistics then describe a hot tier chosen from
    the final counts). Only Algorithm 1's scheduled flushes apply
    ``count_decay``; every flush applies ``ttl_steps`` evictions (when set).
    Without dynamic tables the collection is empty and the hook does nothing.

    Args:
        every_n_steps: run the ops after every this many steps (None: only at the end).

    Example:
        >>> tf.compat.v1.add_to_collection(CACHE_MAINTENANCE, flush_op)
        >>> estimator.train(input_fn, hooks=[CacheMaintenanceHook(every_n_steps=1000)])
    """

    def __init__(self, every_n_steps: int | None = None):
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps <= 0):
            raise ValueError(f"every_n_steps must be a positive int or None, got {every_n_steps!r}.")
        self._every = every_n_steps
        self._ops = []
        self._steps = 0
        self.runs = 0

    def begin(self):
        self._ops = list(tf.compat.v1.get_collection(CACHE_MAINTENANCE))
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        if self._ops and self._every is not None and self._steps % self._every == 0:
            run_context.session.run(self._ops)
            self.runs += 1

    def end(self, session):
        if self._ops:
            session.run(self._ops)
            self.runs += 1


class ShardAwareBroadcastHook(tf.compat.v1.train.SessionRunHook):
    """Broadcasts rank 0's global variables after the session is created, except shards and their slots.

    Horovod's ``BroadcastGlobalVariablesHook`` with hybridtf's rank-local
    variables (sharded packed tables) left out: each rank keeps its own rows.
    """

    def __init__(self, root_rank: int = 0):
        self.root_rank = root_rank
        self._op = None

    def begin(self):
        import horovod.tensorflow as hvd

        from hybridtf._src.integrations.horovod_hooks import graph_local_variables

        local = {v.op.name for v in graph_local_variables()}
        shared = [v for v in tf.compat.v1.global_variables() if v.op.name not in local]
        self._op = hvd.broadcast_variables(shared, self.root_rank) if shared else None

    def after_create_session(self, session, coord):
        if self._op is not None:
            session.run(self._op)


def _broadcast_source(tensor):
    """The Horovod broadcast op a value comes from (through identities), or None."""
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op if op.type.startswith("HorovodBroadcast") else None


def shard_broadcasts(variables) -> list[tuple[str, str]]:
    """``(variable, broadcast op)`` for every Horovod broadcast in the graph that writes into one of ``variables``."""
    found = []
    for var in variables:
        handle = getattr(var, "handle", None)
        target = handle if handle is not None else getattr(var, "_variable", None)
        if target is None:
            continue
        for op in target.consumers():
            if op.type.startswith("HorovodBroadcast"):  # in place
                found.append((var.op.name, op.name))
            elif op.type in ("AssignVariableOp", "Assign") and len(op.inputs) > 1:
                source = _broadcast_source(op.inputs[1])
                if source is not None:
                    found.append((var.op.name, source.name))
    return found


class ShardBroadcastGuardHook(tf.compat.v1.train.SessionRunHook):
    """Refuses, before the session exists, a Horovod broadcast that would overwrite this rank's shards.

    Horovod's ``hvd.BroadcastGlobalVariablesHook`` (its Estimator recipe)
    broadcasts every global variable, the shards of the packed tables included:
    every rank would train with rank 0's rows in place of its own, silently.
    ``distribute.local_broadcast`` wraps ``hvd.broadcast_variables`` to leave
    them out; this hook catches a broadcast that bypassed the wrapper (e.g. a
    ``broadcast_variables`` imported from Horovod before the wrapping). The
    wrapped model_fn adds it to its training hooks; Estimator runs them after
    the hooks given to ``train``, so Horovod's broadcast ops exist when it looks.
    """

    def begin(self):
        from hybridtf._src.integrations.horovod_hooks import graph_local_variables

        found = shard_broadcasts(graph_local_variables())
        if found:
            var, op = found[0]
            raise CaptureError(
                f"hybridtf.estimator: the Horovod broadcast {op!r} (hvd.BroadcastGlobalVariablesHook or "
                f"hvd.broadcast_global_variables) would overwrite {var!r}, this rank's shard of a packed table "
                f"(or its optimizer slot; {len(found)} such variables), with rank 0's rows: every rank holds other "
                "rows of the table. Remove hvd.BroadcastGlobalVariablesHook and pass htf.estimator.hooks(), which "
                "broadcasts every other variable (ShardAwareBroadcastHook)."
            )


def horovod_broadcast_hook(root_rank: int = 0):
    """A broadcast of rank 0's variables (shards excluded) when Horovod is imported, initialized, > 1 rank; else None.

    Example:
        >>> horovod_broadcast_hook() is None  # a single process
        True
    """
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    try:
        if not hvd.is_initialized() or hvd.size() <= 1:
            return None
    except (ValueError, RuntimeError):
        return None
    return ShardAwareBroadcastHook(root_rank)

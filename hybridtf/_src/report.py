"""The PICASSO Table V style report: op counts of the training step, packing plan, table sizes.

``count_ops`` counts the ops of the function Keras runs per training step (the
one ``model.fit`` calls), so a plain model and its ``hybridtf.keras.optimize``d
twin can be compared op for op. ``report`` puts that next to the packing plan,
the packed tables' sizes and the layers hybridtf left alone.

**The counting rule** (the same for every model):

* The graph is the Keras train function (``model.make_train_function()``),
  traced for one batch of the given structure. It is not run.
* Every node of that graph counts once, and so does every node of every
  function it calls, **once per call site** and recursively: a node whose op
  is a function of the graph's library, or that names library functions in
  attributes (``PartitionedCall``/``StatefulPartitionedCall`` ``f``, ``If``
  branches, ``While`` ``cond``/``body``, ``Case`` branches, ...), adds the
  called bodies. A ``While`` body counts once, not once per iteration; both
  branches of an ``If`` count. Library functions no node calls do not count.
* Plumbing does not count: ``PLUMBING_OPS`` (``NoOp``, ``Identity``,
  ``IdentityN``, ``Const``, ``Placeholder``, ``_Arg``, ``_Retval``) and the
  call nodes themselves (``PartitionedCall``, ``StatefulPartitionedCall`` and
  direct calls of library functions), whose bodies are counted instead.

Two counts come out: ``total`` on the graph as traced (it still holds nodes
TensorFlow prunes before running, e.g. the outputs of hybridtf's recording
pass that nothing consumes), and ``grappler_total`` on the same graph after
TensorFlow's default Grappler optimization with the step's outputs and
stateful control outputs as fetches, which is closer to the ops executed.

Example:
    >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> ops = count_ops(model, (features, labels))
    >>> ops["total"], ops["grappler_total"], ops["by_type"].most_common(3)
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Mapping

import tensorflow as tf

from hybridtf._src.capture.keras_capture import SkippedLayer, is_captured
from hybridtf._src.integrations.keras_model import is_optimized
from hybridtf._src.plan.interleaving import InterleavingPlan
from hybridtf._src.plan.packing import PackingPlan

PLUMBING_OPS = frozenset({"NoOp", "Identity", "IdentityN", "Const", "Placeholder", "_Arg", "_Retval"})
"""Op types that move values around without computing: never counted."""

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
"""Function-call ops: not counted themselves, the bodies they call are."""

COUNTING_RULE = (
    "nodes of the Keras train function's graph plus, once per call site and recursively, the bodies of the "
    "library functions they call (While bodies once, both If branches); without NoOp, Identity, IdentityN, "
    "Const, Placeholder, _Arg, _Retval and the call nodes themselves"
)

_JSON_FORMAT = "hybridtf.report"
_JSON_VERSION = 1


# --------------------------------------------------------------------------- counting


def _graph_def(fn) -> tf.compat.v1.GraphDef:
    if isinstance(fn, tf.compat.v1.GraphDef):
        return fn
    if isinstance(fn, tf.Graph):
        return fn.as_graph_def()
    graph = getattr(fn, "graph", None)
    if isinstance(graph, tf.Graph):  # a ConcreteFunction
        return graph.as_graph_def()
    raise TypeError(
        f"count_graph_ops takes a GraphDef, a tf.Graph or a ConcreteFunction, got {type(fn).__name__}; "
        "for a tf.function, pass fn.get_concrete_function(*args)."
    )


def _called_functions(node, library: Mapping) -> list[str]:
    """Names of the library functions ``node`` calls (its op, or function-valued attributes)."""
    called = [node.op] if node.op in library else []
    for value in node.attr.values():
        if value.HasField("func") and value.func.name in library:
            called.append(value.func.name)
        if value.HasField("list"):
            called.extend(f.name for f in value.list.func if f.name in library)
    return called


def count_graph_ops(fn) -> dict:
    """Counts the ops of a graph and of the functions it calls (see the module docstring for the rule).

    Args:
        fn: a ``tf.compat.v1.GraphDef``, a ``tf.Graph`` or a ``ConcreteFunction``.

    Returns:
        ``{"total": int, "by_type": Counter, "function_calls": int, "nodes": int}``: counted ops,
        counted ops per op type, function bodies expanded, and all nodes including plumbing.

    Raises:
        TypeError: ``fn`` is none of the above.

    Example:
        >>> @tf.function
        ... def f(x):
        ...     return tf.sin(x) + 1.0
        >>> count_graph_ops(f.get_concrete_function(tf.TensorSpec([2])))["by_type"]
        Counter({'AddV2': 1, 'Sin': 1})
    """
    graph_def = _graph_def(fn)
    library = {f.signature.name: f for f in graph_def.library.function}
    memo: dict[str, tuple[collections.Counter, int, int]] = {}

    def count_nodes(nodes, active: tuple[str, ...]) -> tuple[collections.Counter, int, int]:
        counts, calls, total_nodes = collections.Counter(), 0, 0
        for node in nodes:
            total_nodes += 1
            called = _called_functions(node, library)
            if node.op not in PLUMBING_OPS and node.op not in CALL_OPS and node.op not in library:
                counts[node.op] += 1
            for name in called:
                if name in active:  # TensorFlow has no recursion; never loop on a malformed library
                    continue
                if name not in memo:
                    memo[name] = count_nodes(library[name].node_def, (*active, name))
                sub_counts, sub_calls, sub_nodes = memo[name]
                counts.update(sub_counts)
                calls += 1 + sub_calls
                total_nodes += sub_nodes
        return counts, calls, total_nodes

    counts, calls, nodes = count_nodes(graph_def.node, ())
    by_type = collections.Counter(dict(sorted(counts.items())))
    return {"total": sum(by_type.values()), "by_type": by_type, "function_calls": calls, "nodes": nodes}


def grappler_graph_def(concrete_fn) -> tf.compat.v1.GraphDef:
    """The graph of ``concrete_fn`` after TensorFlow's default Grappler optimization.

    The fetches are the function's outputs and its control outputs (the stateful
    ops automatic control dependencies keep: variable updates, metric updates),
    so Grappler prunes what the function runtime would not run and keeps every
    update.
    """
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph = concrete_fn.graph
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph.as_graph_def())
    fetch = meta.collection_def["train_op"].node_list.value
    fetch.extend(t.name for t in graph.outputs)
    fetch.extend(op.name for op in graph.control_outputs)
    return tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta, graph_id=b"hybridtf_report")


def _element_spec(data):
    if isinstance(data, tf.data.Dataset):
        return data.element_spec

    def spec(value):
        if isinstance(value, tf.TypeSpec):
            return value
        if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
            return tf.type_spec_from_value(value)
        return tf.TensorSpec.from_tensor(tf.convert_to_tensor(value))

    return tf.nest.map_structure(spec, data)


def train_function_concrete(model: tf.keras.Model, data):
    """The ConcreteFunction of ``model``'s Keras train function for batches shaped like ``data``.

    Traces ``model.make_train_function()`` on an iterator of the batch spec
    (nothing runs, no data is read) and restores ``model.train_function``
    afterwards. Tracing builds the optimizer's slots and the compiled metrics,
    as the first ``fit`` step would.

    Args:
        model: a compiled Keras model.
        data: one batch as ``fit`` gets it (``(x, y)`` or ``(x, y, sample_weight)``,
            tensors or numpy arrays), its ``tf.TypeSpec`` structure, or a
            ``tf.data.Dataset`` of such batches (only its ``element_spec`` is used).

    Raises:
        ValueError: the model is not compiled.
    """
    if not getattr(model, "_is_compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError("count_ops needs a compiled model: call model.compile(optimizer=..., loss=...) first.")
    spec = _element_spec(data)
    empty = tf.data.Dataset.from_generator(lambda: iter(()), output_signature=spec)
    previous = model.train_function
    try:
        train_fn = model.make_train_function(force=True)
        return train_fn.get_concrete_function(iter(empty))
    finally:
        model.train_function = previous


def count_ops(model: tf.keras.Model, data, *, grappler: bool = True) -> dict:
    """Counts the ops of ``model``'s training step (see the module docstring for the exact rule).

    Args:
        model: a compiled Keras model, plain or optimized by ``hybridtf.keras.optimize``.
        data: one batch as ``fit`` gets it (``(x, y)`` or ``(x, y, sample_weight)``), its spec
            structure, or a ``tf.data.Dataset`` of batches (only its ``element_spec`` is used).
        grappler: also count after Grappler's default optimization.

    Returns:
        A dict: ``total`` and ``by_type`` (a ``collections.Counter``) for the graph as traced;
        ``function_calls`` (nested function bodies counted) and ``nodes`` (all nodes, plumbing
        included); ``grappler_total`` / ``grappler_by_type`` after Grappler, None when
        ``grappler=False`` or when Grappler failed (``grappler_error`` says why); ``rule``.

    Raises:
        ValueError: the model is not compiled.

    Example:
        >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> ops = count_ops(model, (features, labels))
        >>> ops["total"], ops["by_type"].most_common(3)
    """
    concrete = train_function_concrete(model, data)
    result = count_graph_ops(concrete)
    result.update(grappler_total=None, grappler_by_type=None, grappler_error=None, rule=COUNTING_RULE)
    if grappler:
        try:
            optimized = count_graph_ops(grappler_graph_def(concrete))
        except Exception as err:  # Grappler is best effort: report why, keep the plain count
            result["grappler_error"] = f"{type(err).__name__}: {err}"
        else:
            result["grappler_total"] = optimized["total"]
            result["grappler_by_type"] = optimized["by_type"]
    return result


# --------------------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True)
class TableStats:
    """Size of one embedding table as the model stores it: a packed table or an unpacked layer.

    Attributes:
        name: packed table name (from the plan), or the layer name of an unpacked table.
        packed: whether this is a packed table.
        dim: embedding width.
        dtype: dtype name.
        tables: number of the model's tables it holds (1 when unpacked).
        rows: rows.
        params: ``rows * dim``.
        bytes: bytes of the values (optimizer slots not included).
        members: the model's tables it holds.
    """

    name: str
    packed: bool
    dim: int
    dtype: str
    tables: int
    rows: int
    params: int
    bytes: int
    members: tuple[str, ...]

    @classmethod
    def make(cls, name: str, packed: bool, rows: int, dim: int, dtype: str, members) -> TableStats:
        params = int(rows) * int(dim)
        members = tuple(members)
        nbytes = params * tf.as_dtype(dtype).size
        return cls(name, packed, int(dim), dtype, len(members), int(rows), params, nbytes, members)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "members": list(self.members)}

    @classmethod
    def from_dict(cls, d: Mapping) -> TableStats:
        return cls(**{**d, "members": tuple(d["members"])})


def _ratio(after, before) -> float | None:
    return None if after is None or not before else after / before


def _counts_to_dict(counts: Mapping | None) -> dict | None:
    if counts is None:
        return None
    return {k: (dict(v) if isinstance(v, collections.Counter) else v) for k, v in counts.items()}


def _counts_from_dict(d: Mapping | None) -> dict | None:
    if d is None:
        return None
    out = dict(d)
    for key in ("by_type", "grappler_by_type"):
        if out.get(key) is not None:
            out[key] = collections.Counter(out[key])
    return out


@dataclasses.dataclass(frozen=True)
class Report:
    """What hybridtf did to a model, PICASSO Table V style. Plain data; prints and round-trips JSON.

    Attributes:
        model_name: the Keras model's name.
        optimized: whether the model went through ``hybridtf.keras.optimize``.
        ops: ``count_ops`` of the model.
        baseline_ops: ``count_ops`` of the plain baseline model, if one was given.
        plan: the packing plan (None for a model without one).
        skipped: embedding layers left unpacked, with the reason.
        tables: packed tables and unpacked embedding layers, with their sizes.
        communication: per-rank bytes sent per step by alltoall and
            allreduce under Horovod (``estimate_traffic``), or None.
        fused_concats: ``Concatenate`` layers computed by one StitchConcat op.
        fused_dense: ``Dense`` layers multiplying a fused concatenation with
            one StitchConcatMatMul op.
        shared_uniques: packed tables that take their unique ids from
            another packed table's chain (table -> source).
        interleaving: the model's ``InterleavingPlan`` as a dict (K-groups
            with Capacity_g and members, excluded embeddings, micro-batching
            and how Eq. 2 chose it), or None.

    Example:
        >>> r = report(optimized_model, (features, labels), baseline=plain_model)
        >>> print(r)
        >>> Report.from_json(r.to_json()) == r
        True
    """

    model_name: str
    optimized: bool
    ops: dict
    baseline_ops: dict | None
    plan: PackingPlan | None
    skipped: tuple[SkippedLayer, ...]
    tables: tuple[TableStats, ...]
    communication: dict | None = None
    fused_concats: tuple[str, ...] = ()
    fused_dense: tuple[str, ...] = ()
    shared_uniques: dict = dataclasses.field(default_factory=dict)
    interleaving: dict | None = None

    @property
    def ops_ratio(self) -> float | None:
        """Counted ops of this model / of the baseline (None without a baseline)."""
        return _ratio(self.ops["total"], self.baseline_ops and self.baseline_ops["total"])

    @property
    def grappler_ops_ratio(self) -> float | None:
        """The same ratio after Grappler (None without a baseline or Grappler counts)."""
        return _ratio(self.ops.get("grappler_total"), self.baseline_ops and self.baseline_ops.get("grappler_total"))

    def to_dict(self) -> dict:
        return {
            "format": _JSON_FORMAT,
            "version": _JSON_VERSION,
            "model_name": self.model_name,
            "optimized": self.optimized,
            "ops": _counts_to_dict(self.ops),
            "baseline_ops": _counts_to_dict(self.baseline_ops),
            "ops_ratio": self.ops_ratio,
            "grappler_ops_ratio": self.grappler_ops_ratio,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "skipped": [{"name": s.name, "reason": s.reason} for s in self.skipped],
            "tables": [t.to_dict() for t in self.tables],
            "table_totals": self.table_totals(),
            "communication": self.communication,
            "fused_concats": list(self.fused_concats),
            "fused_dense": list(self.fused_dense),
            "shared_uniques": dict(self.shared_uniques),
            "interleaving": self.interleaving,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (``Report.from_json`` reads it back to an equal report)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping) -> Report:
        if d.get("format") != _JSON_FORMAT or d.get("version") != _JSON_VERSION:
            raise ValueError(f"not a hybridtf report of version {_JSON_VERSION}: format={d.get('format')!r}.")
        return cls(
            model_name=d["model_name"],
            optimized=d["optimized"],
            ops=_counts_from_dict(d["ops"]),
            baseline_ops=_counts_from_dict(d["baseline_ops"]),
            plan=PackingPlan.from_dict(d["plan"]) if d["plan"] is not None else None,
            skipped=tuple(SkippedLayer(s["name"], s["reason"]) for s in d["skipped"]),
            tables=tuple(TableStats.from_dict(t) for t in d["tables"]),
            communication=d.get("communication"),
            fused_concats=tuple(d.get("fused_concats", ())),
            fused_dense=tuple(d.get("fused_dense", ())),
            shared_uniques=dict(d.get("shared_uniques", {})),
            interleaving=d.get("interleaving"),
        )

    @classmethod
    def from_json(cls, s: str) -> Report:
        """Reads a report written by ``to_json``."""
        return cls.from_dict(json.loads(s))

    def table_totals(self) -> dict:
        """Sums over ``tables``: the model's tables, packed tables, unpacked tables, rows, params, bytes."""
        return {
            "model_tables": sum(t.tables for t in self.tables),
            "packed_tables": sum(t.packed for t in self.tables),
            "unpacked_tables": sum(not t.packed for t in self.tables),
            "rows": sum(t.rows for t in self.tables),
            "params": sum(t.params for t in self.tables),
            "bytes": sum(t.bytes for t in self.tables),
        }

    def __str__(self) -> str:
        kind = "optimized by hybridtf" if self.optimized else "not optimized"
        lines = [f"hybridtf report: model {self.model_name!r} ({kind})", *self._ops_lines(), ""]
        lines.append(str(self.plan) if self.plan is not None else "no packing plan")
        lines += ["", *self._table_lines(), ""]
        if self.skipped:
            lines.append(f"skipped embedding layers ({len(self.skipped)}):")
            lines += [f"  {s.name}: {s.reason}" for s in self.skipped]
        else:
            lines.append("skipped embedding layers: none")
        if self.optimized:
            fused = ", ".join(self.fused_concats) if self.fused_concats else "none"
            lines.append(f"Concatenate layers fused with the lookups (StitchConcat): {fused}")
            dense = ", ".join(self.fused_dense) if self.fused_dense else "none"
            lines.append(f"Dense layers multiplying through the distinct rows (StitchConcatMatMul): {dense}")
            shared = ", ".join(f"{t} <- {src}" for t, src in sorted(self.shared_uniques.items()))
            lines.append(f"packed tables reusing another chain's unique ids (UniqueSubset): {shared or 'none'}")
            plan = self.interleaving and InterleavingPlan.from_dict(self.interleaving)
            lines.append(str(plan) if plan else "interleaving: none (one group, whole batch)")
        if self.communication:
            c = self.communication
            lines += [
                "",
                f"hybrid parallel on {c['num_ranks']} ranks ({c['batch_per_rank']} examples per rank per step), "
                "bytes sent per rank per step:",
            ]
            lines += [
                f"  rank {r['rank']}: alltoall {r['alltoall_bytes']:,}  allreduce {r['allreduce_bytes']:,}"
                for r in c["per_rank"]
            ]
            placements = ", ".join(f"{name}: {t['placement']}" for name, t in c["tables"].items())
            lines.append(f"  (dense gradients {c['dense_gradient_bytes']:,} bytes; {placements})")
        return "\n".join(lines)

    def _ops_lines(self) -> list[str]:
        base = self.baseline_ops
        lines = ["training-step ops (Keras train function; rule: hybridtf.report.COUNTING_RULE):"]
        rows = [("graph as traced", self.ops["total"], base and base["total"])]
        if self.ops.get("grappler_total") is not None:
            rows.append(("after Grappler", self.ops["grappler_total"], base and base.get("grappler_total")))
        elif self.ops.get("grappler_error"):
            lines.append(f"  (no Grappler count: {self.ops['grappler_error']})")
        lines.append(f"  {'':18}{'baseline':>10}{'this model':>12}{'ratio':>9}")
        for label, mine, theirs in rows:
            ratio = _ratio(mine, theirs)
            cell = f"{ratio:8.3f}x" if ratio is not None else f"{'-':>9}"
            lines.append(f"  {label:18}{theirs if theirs is not None else '-':>10}{mine:>12}{cell}")
        if base is not None:
            grappler = self.ops.get("grappler_by_type") is not None and base.get("grappler_by_type") is not None
            key = "grappler_by_type" if grappler else "by_type"
            mine, theirs = self.ops[key], base[key]
            diffs = sorted(set(mine) | set(theirs), key=lambda op: (-abs(mine[op] - theirs[op]), op))
            shown = [op for op in diffs if mine[op] != theirs[op]][:12]
            if shown:
                where = "after Grappler" if grappler else "graph as traced"
                lines.append(f"  largest changes by op type ({where}, baseline -> this model):")
                lines += [f"    {op:32}{theirs[op]:>8} -> {mine[op]}" for op in shown]
        return lines

    def _table_lines(self) -> list[str]:
        tot = self.table_totals()
        lines = [
            f"embedding tables: {tot['model_tables']} tables in {tot['packed_tables']} packed + "
            f"{tot['unpacked_tables']} unpacked; {tot['rows']:,} rows, {tot['params']:,} parameters, "
            f"{tot['bytes'] / 2**20:,.1f} MiB"
        ]
        header = ("table", "kind", "dim", "dtype", "tables", "rows", "params", "MiB")
        rows = [
            (t.name, "packed" if t.packed else "unpacked", str(t.dim), t.dtype, str(t.tables), f"{t.rows:,}",
             f"{t.params:,}", f"{t.bytes / 2**20:,.2f}")
            for t in self.tables
        ]  # fmt: skip
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            cells = [r[i].ljust(w) if i in (0, 1, 3) else r[i].rjust(w) for i, w in enumerate(widths)]
            lines.append("  " + "  ".join(cells))
        return lines


def _table_stats(model: tf.keras.Model, plan: PackingPlan | None) -> list[TableStats]:
    stats = []
    if plan is not None:
        stats += [TableStats.make(p.name, True, p.num_rows, p.dim, p.dtype, p.member_names) for p in plan.packed_tables]
    seen = set()
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, tf.keras.layers.Embedding) or is_captured(layer) or id(layer) in seen:
            continue
        seen.add(id(layer))
        embeddings = getattr(layer, "embeddings", None)
        if embeddings is None:  # not built: nothing stored yet
            continue
        rows, dim = embeddings.shape.as_list()
        stats.append(TableStats.make(layer.name, False, rows, dim, embeddings.dtype.name, [layer.name]))
    return stats


def report(
    model: tf.keras.Model, sample_batch, *, baseline: tf.keras.Model | None = None, num_ranks: int | None = None
) -> Report:
    """Reports what hybridtf did to ``model``: training-step ops (vs a baseline), plan, tables, skipped layers.

    Args:
        model: a compiled Keras model, usually one returned by ``hybridtf.keras.optimize``.
        sample_batch: one batch as ``fit`` gets it, its spec structure, or a ``tf.data.Dataset``
            (see ``count_ops``).
        baseline: the same model without hybridtf, compiled, to compare op counts with.
        num_ranks: estimate the bytes each rank sends per step when trained
            on this many Horovod ranks (``sample_batch`` as a global batch
            ``(features, labels)``); default: the Horovod job's size when the
            report runs under ``horovodrun``, else no estimate.

    Returns:
        A ``Report``: ``print`` it, or ``to_json()``.

    Raises:
        ValueError: a model is not compiled.

    Example:
        >>> plain = build_model()
        >>> model = htf.keras.optimize(build_model())
        >>> for m in (plain, model):
        ...     m.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> print(htf.report.report(model, (features, labels), baseline=plain))
    """
    optimized = is_optimized(model)
    plan = model.hybridtf_plan if optimized else None
    skipped = tuple(getattr(model, "_htf_skipped", ()))
    return Report(
        model_name=model.name,
        optimized=optimized,
        ops=count_ops(model, sample_batch),
        baseline_ops=count_ops(baseline, sample_batch) if baseline is not None else None,
        plan=plan,
        skipped=skipped,
        tables=tuple(_table_stats(model, plan)),
        communication=_communication(model, sample_batch, num_ranks) if optimized else None,
        fused_concats=tuple(model.hybridtf_fused_concats) if optimized else (),
        fused_dense=tuple(model.hybridtf_fused_dense) if optimized else (),
        shared_uniques=dict(model._htf_runtime.shared_uniques) if optimized else {},
        interleaving=_interleaving(model) if optimized else None,
    )


def _interleaving(model) -> dict | None:
    plan = getattr(model, "hybridtf_interleaving", None)
    return plan.to_dict() if plan is not None else None


def _communication(model, sample_batch, num_ranks):
    from hybridtf._src.distribute.traffic import estimate_traffic
    from hybridtf._src.distribute.world import current_world

    if num_ranks is None:
        world = current_world()
        num_ranks = world.size if world.distributed else None
    if not num_ranks or num_ranks < 2:
        return None
    if not isinstance(sample_batch, (tuple, list)):
        raise ValueError("num_ranks needs sample_batch as a batch (features, labels), not a spec or a dataset.")
    return estimate_traffic(model, sample_batch[0], num_ranks)


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    """``python -m hybridtf.report --model wdl|deepfm|dlrm|din --fields criteo|200 [--ranks N] [--json]``.

    Builds the plain and the optimized benchmark model (``benchmarks/ctr_models.py``, the
    configurations of ``benchmarks/bench_keras.py``), compiles both with Adagrad and prints the
    report. Needs the hybridtf repository checkout (the ``benchmarks`` package), run from its root.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hybridtf.report", description="hybridtf op-count report")
    parser.add_argument("--model", choices=("wdl", "deepfm", "dlrm", "din", "none"), default="wdl")
    parser.add_argument("--fields", choices=("criteo", "200", "f200"), default="criteo")
    parser.add_argument("--batch", type=int, default=256, help="batch size of the traced step (default 256)")
    parser.add_argument(
        "--ranks", type=int, default=2, help="estimate bytes sent per rank per step on this many ranks (0: skip)"
    )
    parser.add_argument("--micro-batches", type=int, default=1, help="D-interleaving: micro-batches per step")
    parser.add_argument("--interleave-from", choices=("embedding", "mlp"), default="embedding")
    parser.add_argument("--interleave-groups", type=int, default=None, help="K-interleaving: number of groups")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--dynamic", type=int, default=0, metavar="STEPS", help="dynamic-table section: train STEPS")
    args = parser.parse_args(argv)
    if args.dynamic:  # HybridHash statistics of a small DynamicEmbedding model (report_dynamic.py)
        from hybridtf._src.report_dynamic import dynamic_section

        section = dynamic_section(steps=args.dynamic)
        print(json.dumps({"dynamic_tables": section.to_dict()}) if args.json else section)
    if args.model == "none":
        return 0
    try:
        from benchmarks import bench_keras
    except ImportError as err:
        parser.error(
            f"this command builds the benchmark models from the repository's benchmarks/ package ({err}); "
            "run it from the root of a hybridtf checkout."
        )
    import hybridtf.keras

    field_set = "f200" if args.fields in ("200", "f200") else "criteo"
    config = bench_keras.Config(model=args.model, fields=field_set, optimizer="adagrad", batch=args.batch)
    fields = bench_keras.make_fields(config)
    batch = bench_keras.sample_batch(config, fields)
    plain = bench_keras.build_model(config, fields, batch[0])
    model = hybridtf.keras.optimize(
        bench_keras.build_model(config, fields, batch[0]),
        micro_batches=args.micro_batches,
        interleave_from=args.interleave_from,
        interleave_groups=args.interleave_groups,
    )
    for m in (plain, model):
        m.compile(optimizer=bench_keras.make_optimizer("adagrad"), loss="binary_crossentropy")
    result = report(model, batch, baseline=plain, num_ranks=args.ranks or None)
    if args.json:
        d = result.to_dict()
        d["config"] = dataclasses.asdict(config)
        print(json.dumps(d))
    else:
        print(f"config: {config.label} (batch {config.batch})")
        print(result)
    return 0

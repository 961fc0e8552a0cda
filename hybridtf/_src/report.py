"""The PICASSO Table V style report: what hybridtf did to a Keras model, as plain data.

``report`` puts the op counts of the training step (``hybridtf._src.op_count``; the model and
a baseline) next to the packing plan, the packed tables' sizes, the layers hybridtf left alone
and why, the fusions applied, the interleaving plan and, under Horovod, the bytes each rank sends.
``Report`` prints as text and round-trips through JSON.

Example:
    >>> r = report(optimized_model, (features, labels), baseline=plain_model)
    >>> print(r)
"""

from __future__ import annotations

import collections
import dataclasses
import json
import numbers
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from hybridtf._src.capture.keras_capture import SkippedLayer, is_captured
from hybridtf._src.integrations.keras_model import has_packed_tables, is_optimized
from hybridtf._src.integrations.keras_unpacked import UnpackedModelMixin, fusions_traced
from hybridtf._src.op_count import COUNTING_RULE, PLUMBING_OPS, count_graph_ops, count_ops, synthetic_batch
from hybridtf._src.plan.interleaving import InterleavingPlan
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.report_dynamic import bytes_per_row_text, dynamic_tables

__all__ = [
    "COUNTING_RULE",
    "PLUMBING_OPS",
    "Report",
    "TableStats",
    "count_graph_ops",
    "count_ops",
    "report",
    "synthetic_batch",
]

_JSON_FORMAT = "hybridtf.report"
_JSON_VERSION = 1


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
        optimized: whether the model went through ``hybridtf.keras.optimize``
            (also when it packed nothing).
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
        other_fusions: the other fusions of the last traced step, by kind
            (``fm``: factorization-machine cross terms as one StitchFM;
            ``dice``: Dice activations as one Dice op; ``attention``: DIN
            attention products computed once per example; ``outer_products``:
            batched 1-deep matrix products as a broadcast ``Mul``), each a list
            of where it happened; kinds with nothing fused are left out.
        interleaving: the model's ``InterleavingPlan`` as a dict (K-groups
            with Capacity_g and members, excluded embeddings, micro-batching
            and how Eq. 2 chose it), or None.
        dynamic_plan: the packed HybridHash stores (``model.hybridtf_dynamic_plan``)
            as ``{"name", "dim", "members"}`` dicts: the DynamicEmbedding tables
            of one dim that ``optimize`` put into one store and one chain.
        dynamic_tables: ``{table: metrics}`` of the model's DynamicEmbedding
            (HybridHash) tables as they stand: rows, hot-tier hit ratio (last
            step and cumulative), inserts, evictions, flushes, bytes per row.

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
    dynamic_tables: dict = dataclasses.field(default_factory=dict)
    dynamic_plan: tuple = ()
    other_fusions: dict = dataclasses.field(default_factory=dict)

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
            "dynamic_tables": dict(self.dynamic_tables),
            "dynamic_plan": [dict(g) for g in self.dynamic_plan],
            "other_fusions": {kind: list(where) for kind, where in self.other_fusions.items()},
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
            dynamic_tables=dict(d.get("dynamic_tables", {})),
            dynamic_plan=tuple(
                {"name": g["name"], "dim": g["dim"], "members": list(g["members"])} for g in d.get("dynamic_plan", ())
            ),
            other_fusions={kind: list(where) for kind, where in d.get("other_fusions", {}).items()},
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
        if self.optimized and not self.dynamic_plan and not (self.plan and self.plan.packed_tables):
            kind = "through hybridtf.keras.optimize, nothing packed"
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
            lines += [
                f"{OTHER_FUSIONS[kind]}: {', '.join(where)}" for kind, where in self.other_fusions.items() if where
            ]
            plan = self.interleaving and InterleavingPlan.from_dict(self.interleaving)
            lines.append(str(plan) if plan else "interleaving: none (one group, whole batch)")
        if self.optimized:
            stores = [f"{g['name']} (dim {g['dim']}: {', '.join(g['members'])})" for g in self.dynamic_plan]
            lines.append(f"DynamicEmbedding tables packed per HybridHash store: {'; '.join(stores) or 'none'}")
        if self.dynamic_tables:
            lines.append(f"dynamic tables (HybridHash): {len(self.dynamic_tables)}")
            lines += [
                f"  {name}: {m['size']:,} rows, hit ratio {m['hit_ratio']:.3f} last step / "
                f"{m['hit_ratio_cumulative']:.3f} cumulative, {m['inserts']:,} inserts, {m['evictions']:,} evictions, "
                f"{m['flushes']:,} flushes, {bytes_per_row_text(m)}"
                for name, m in self.dynamic_tables.items()
            ]
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
            if c.get("ids_one_value"):
                lines.append(
                    "  (every id input of the traced batch holds one value, e.g. the synthetic batch's id 0: each "
                    "table sends one distinct row, far less than real data; pass a batch of real ids for a real "
                    "estimate)"
                )
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
    model: tf.keras.Model,
    sample_batch=None,
    *,
    baseline: tf.keras.Model | None = None,
    num_ranks: int | None = None,
) -> Report:
    """Reports what hybridtf did to ``model``: training-step ops (vs a baseline), plan, tables, skipped layers.

    Args:
        model: a compiled Keras model, usually one returned by ``hybridtf.keras.optimize``.
        sample_batch: one batch as ``fit`` gets it, its spec structure, or a ``tf.data.Dataset``
            (see ``count_ops``); None: a ``synthetic_batch`` of the model's inputs.
        baseline: the same model without hybridtf, compiled, to compare op counts with.
        num_ranks: estimate the bytes each rank sends per step when trained
            on this many Horovod ranks (``sample_batch`` as a global batch
            ``(features, labels)``); default: the Horovod job's size when the
            report runs under ``horovodrun``, else no estimate.

    Returns:
        A ``Report``: ``print`` it, or ``to_json()``.

    Raises:
        TypeError: ``model`` or ``baseline`` is not a Keras model.
        ValueError: a model is not compiled.

    Example:
        >>> plain = build_model()
        >>> model = htf.keras.optimize(build_model())
        >>> for m in (plain, model):
        ...     m.compile(optimizer="adagrad", loss="binary_crossentropy")
        >>> print(htf.report.report(model, (features, labels), baseline=plain))
    """
    for what, m in (("model", model), ("baseline", baseline)):
        if m is not None and not isinstance(m, tf.keras.Model):
            raise TypeError(
                f"hybridtf.report.report: {what} must be a tf.keras.Model, got {type(m).__name__}. For functional "
                "Tables in a custom loop, count the ops of your step's concrete function instead: "
                "hybridtf.report.count_graph_ops(step.get_concrete_function(batch))."
            )
    if num_ranks is not None and (isinstance(num_ranks, bool) or not isinstance(num_ranks, numbers.Integral)):
        raise ValueError(f"hybridtf.report.report: num_ranks must be an int (the number of ranks), got {num_ranks!r}.")
    if num_ranks is not None and num_ranks < 1:
        raise ValueError(
            f"hybridtf.report.report: num_ranks must be >= 1 (2 or more estimate the traffic), got {num_ranks}."
        )
    if baseline is not None and (not getattr(baseline, "_is_compiled", False) or baseline.optimizer is None):
        raise ValueError(
            "hybridtf.report.report: the baseline model is not compiled; compile it as the model is "
            "(baseline.compile(optimizer=..., loss=...)) to compare their training steps."
        )
    if sample_batch is None:
        sample_batch = synthetic_batch(model)
    # through optimize: packed static tables, dynamic stores only, or nothing packable
    optimized = is_optimized(model) or isinstance(model, UnpackedModelMixin)
    packed = has_packed_tables(model)
    plan = model.hybridtf_plan if optimized else None
    skipped = tuple(getattr(model, "_htf_skipped", ()))
    dynamic_plan = tuple(
        {"name": g.name, "dim": int(g.dim), "members": list(g.members)}
        for g in (getattr(model, "hybridtf_dynamic_plan", None) or () if optimized else ())
    )
    return Report(
        model_name=model.name,
        optimized=optimized,
        ops=count_ops(model, sample_batch),
        baseline_ops=count_ops(baseline, sample_batch) if baseline is not None else None,
        plan=plan,
        skipped=skipped,
        tables=tuple(_table_stats(model, plan)),
        communication=_communication(model, sample_batch, num_ranks) if packed or dynamic_plan else None,
        fused_concats=tuple(model.hybridtf_fused_concats) if optimized else (),
        fused_dense=tuple(model.hybridtf_fused_dense) if optimized else (),
        shared_uniques=dict(model._htf_runtime.shared_uniques) if packed else {},
        interleaving=_interleaving(model) if optimized else None,
        dynamic_tables=dynamic_tables(model),
        dynamic_plan=dynamic_plan,
        other_fusions={k: where for k in OTHER_FUSIONS if (where := fusions_traced(model, k))} if optimized else {},
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
    traffic = estimate_traffic(model, sample_batch[0], num_ranks)
    traffic["ids_one_value"] = _ids_one_value(sample_batch[0])
    return traffic


def _ids_one_value(features) -> bool:
    """Whether every integer input of ``features`` holds at most one distinct value (a degenerate batch)."""
    ints = []
    for t in tf.nest.flatten(features, expand_composites=False):
        if isinstance(t, tf.RaggedTensor):
            values = np.asarray(t.flat_values)
        else:
            values = np.asarray(t.values if isinstance(t, tf.SparseTensor) else t)
        if values.dtype.kind in "iu":
            ints.append(values)
    return bool(ints) and all(np.unique(v).size <= 1 for v in ints)


# Fusion kinds beyond the concatenations, dense layers and shared unique ids, as the report names them.
OTHER_FUSIONS = {
    "fm": "factorization-machine cross terms fused (StitchFM)",
    "dice": "Dice activations fused (Dice)",
    "attention": "DIN attention products computed once per example",
    "outer_products": "batched 1-deep matrix products as a broadcast Mul",
}

"""The packing planner: which tables share a packed table (PICASSO §III.B D-packing).

``plan_packing`` turns the model's table specs (and, when given, warm-up id
statistics) into a ``PackingPlan``:

1. **D-packing.** Tables with the same ``(dim, dtype, optimizer_layout)`` form
   one group; one group becomes one lookup chain after the rewrite (pack ids ->
   fused Unique&Partition -> gather/shuffle -> fused Stitch&Combine). Users can
   keep tables out (``exclude``) or force a grouping (``force_groups``).
2. **Sharding by CalcVParam (Eq. 1).** A group whose CalcVParam is above the
   average over groups is split evenly into shards, so that no packed
   operation carries a much larger parameter volume than the others.
3. **Layout.** Every packed table stacks its members' rows: member ``t``'s
   row ``i`` is packed row ``row_offset(t) + i``.

The plan is plain data: it prints as a small table, round-trips through JSON
and answers the rewrite stage's questions (``location``,
``num_lookup_chains``). TensorFlow-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hybridtf._src.errors import PlanKeyError
from hybridtf._src.plan.sharding import check_strategy
from hybridtf._src.plan.stats import IdFrequencies, TableStats, calc_vparam, id_frequencies, index_tables
from hybridtf._src.plan.tables import PackedMember, PackedTable, TableSpec, UnpackedTable

DEFAULT_MAX_SHARDS = 8
EXCLUDED_BY_USER = "excluded by user"
_JSON_FORMAT = "hybridtf.packing_plan"
_JSON_VERSION = 1


@dataclass(frozen=True)
class PackingPlan:
    """Which tables share which packed table, and where their rows live.

    Attributes:
        tables: the model's tables, in input order.
        packed_tables: the packed tables (one lookup chain each), ordered by
            their first member's position in ``tables``.
        unpacked: tables that keep their own lookup chain, with the reason.
        vparam_source: ``"warmup"`` (CalcVParam in floats per step, from
            warm-up statistics) or ``"uniform"`` (floats per example, uniform
            access, from ``TableSpec.ids_per_sample``).
        average_vparam: mean CalcVParam over the D-packing groups before
            splitting (the "average" of the splitting rule).
        max_shards: the most shards one group may be split into.
        shard_strategy: how the rows of a packed table are spread over the
            ranks of a Horovod job (``"mod"``: row ``r`` on rank ``r % size``;
            ``"range"``: contiguous near-equal row ranges). One process holds
            every row.
        replicate_below_rows: packed tables with fewer rows than this stay
            whole on every rank and are trained data-parallel (their
            gradients allreduced) instead of being sharded; 0: shard all.

    Raises:
        ValueError: the parts are inconsistent (a table missing or placed
            twice, a member that does not match its spec, duplicate names),
            e.g. in a hand-edited JSON plan.

    Example:
        >>> ts = [TableSpec("a", 100, 8), TableSpec("b", 50, 8), TableSpec("c", 10, 4)]
        >>> plan = plan_packing(ts, exclude=["c"])
        >>> [p.member_names for p in plan.packed_tables], plan.location("b"), plan.num_lookup_chains
        ([['a', 'b']], ('packed_8d_float32_sgd', 100), 2)
    """

    tables: tuple[TableSpec, ...]
    packed_tables: tuple[PackedTable, ...]
    unpacked: tuple[UnpackedTable, ...]
    vparam_source: str
    average_vparam: float
    max_shards: int = DEFAULT_MAX_SHARDS
    shard_strategy: str = "mod"
    replicate_below_rows: int = 0
    _where: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("tables", "packed_tables", "unpacked"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_strategy(self.shard_strategy)
        if isinstance(self.replicate_below_rows, bool) or not isinstance(self.replicate_below_rows, int):
            raise ValueError(f"replicate_below_rows must be an int >= 0, got {self.replicate_below_rows!r}.")
        if self.replicate_below_rows < 0:
            raise ValueError(f"replicate_below_rows must be >= 0, got {self.replicate_below_rows}.")
        specs = index_tables(self.tables)
        where: dict[str, tuple[str, int]] = {}
        placed: dict[str, str] = {}
        packed_names = set()
        for p in self.packed_tables:
            if p.name in packed_names:
                raise ValueError(f"two packed tables are named {p.name!r}; packed table names must be unique.")
            packed_names.add(p.name)
            for m in p.members:
                self._place(m.name, f"packed table {p.name!r}", specs, placed)
                t = specs[m.name]
                if m.num_rows != t.num_rows or t.pack_key != (p.dim, p.dtype, p.optimizer_layout):
                    raise ValueError(
                        f"packed table {p.name!r} (dim {p.dim}, {p.dtype}, {p.optimizer_layout}) lists table "
                        f"{t.name!r} with {m.num_rows} rows, but the table has {t.num_rows} rows, dim {t.dim}, "
                        f"{t.dtype}, {t.optimizer_layout}."
                    )
                where[m.name] = (p.name, m.row_offset)
        for u in self.unpacked:
            self._place(u.name, "the unpacked tables", specs, placed)
        missing = [n for n in specs if n not in placed]
        if missing:
            names = ", ".join(map(repr, missing))
            raise ValueError(f"the plan does not place table(s) {names}; place each table once.")
        object.__setattr__(self, "_where", where)

    @staticmethod
    def _place(name: str, where: str, specs: Mapping[str, TableSpec], placed: dict[str, str]) -> None:
        if name not in specs:
            raise ValueError(f"{where} lists table {name!r}, which is not one of the plan's tables.")
        if name in placed:
            raise ValueError(f"table {name!r} is placed twice (in {placed[name]} and in {where}); place it once.")
        placed[name] = where

    @property
    def num_lookup_chains(self) -> int:
        """Lookup chains after the rewrite: one per packed table plus one per unpacked table."""
        return len(self.packed_tables) + len(self.unpacked)

    def location(self, table_name: str) -> tuple[str, int]:
        """Where a table's rows live: ``(packed table name, row_offset)``.

        Raises:
            PlanKeyError: (a ``KeyError``) the table is unpacked or unknown.
        """
        if table_name in self._where:
            return self._where[table_name]
        for u in self.unpacked:
            if u.name == table_name:
                raise PlanKeyError(f"table {table_name!r} is not packed ({u.reason}); it keeps its own lookup chain.")
        names = [t.name for t in self.tables]
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        raise PlanKeyError(f"table {table_name!r} is not in the plan (tables: {shown}).")

    def placement(self, packed_name: str, num_ranks: int) -> str:
        """How packed table ``packed_name`` lives on ``num_ranks`` ranks.

        Returns:
            ``"local"`` (one process: all rows), ``"replicated"`` (all rows on
            every rank, data-parallel: fewer rows than ``replicate_below_rows``)
            or ``"sharded"`` (rows spread by ``shard_strategy``, model-parallel).
        """
        if num_ranks <= 1:
            return "local"
        if self.packed_table(packed_name).num_rows < self.replicate_below_rows:
            return "replicated"
        return "sharded"

    def packed_table(self, name: str) -> PackedTable:
        """The packed table called ``name``; PlanKeyError if there is none."""
        for p in self.packed_tables:
            if p.name == name:
                return p
        raise PlanKeyError(f"no packed table named {name!r} (have: {', '.join(p.name for p in self.packed_tables)}).")

    def table(self, name: str) -> TableSpec:
        """The spec of table ``name``; PlanKeyError if unknown."""
        for t in self.tables:
            if t.name == name:
                return t
        raise PlanKeyError(f"table {name!r} is not in the plan.")

    def to_dict(self) -> dict:
        return {
            "format": _JSON_FORMAT,
            "version": _JSON_VERSION,
            "vparam_source": self.vparam_source,
            "average_vparam": self.average_vparam,
            "max_shards": self.max_shards,
            "shard_strategy": self.shard_strategy,
            "replicate_below_rows": self.replicate_below_rows,
            "tables": [t.to_dict() for t in self.tables],
            "packed_tables": [p.to_dict() for p in self.packed_tables],
            "unpacked": [u.to_dict() for u in self.unpacked],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The plan as JSON (``PackingPlan.from_json`` reads it back to an equal plan)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping) -> PackingPlan:
        if d.get("format") != _JSON_FORMAT or d.get("version") != _JSON_VERSION:
            raise ValueError(
                f"not a hybridtf packing plan of version {_JSON_VERSION} (format={d.get('format')!r}, "
                f"version={d.get('version')!r}). Write plans with PackingPlan.to_json."
            )
        try:
            return cls(
                tables=[TableSpec.from_dict(t) for t in d["tables"]],
                packed_tables=[PackedTable.from_dict(p) for p in d["packed_tables"]],
                unpacked=[UnpackedTable(**u) for u in d["unpacked"]],
                vparam_source=d["vparam_source"],
                average_vparam=float(d["average_vparam"]),
                max_shards=d["max_shards"],
                shard_strategy=d.get("shard_strategy", "mod"),
                replicate_below_rows=d.get("replicate_below_rows", 0),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed packing plan: {err!r}. Write plans with PackingPlan.to_json.") from err

    @classmethod
    def from_json(cls, s: str) -> PackingPlan:
        """Reads a plan written by ``to_json``.

        Raises:
            ValueError: not JSON, not a packing plan, or an inconsistent plan.
        """
        return cls.from_dict(json.loads(s))

    def __str__(self) -> str:
        unit = "floats/step, warm-up stats" if self.vparam_source == "warmup" else "floats/example, uniform access"
        lines = [
            f"PackingPlan: {len(self.tables)} tables -> {self.num_lookup_chains} lookup chains "
            f"({len(self.packed_tables)} packed, {len(self.unpacked)} unpacked); "
            f"CalcVParam in {unit}; group average {self.average_vparam:,.1f}"
        ]
        header = ("packed table", "dim", "dtype", "optimizer", "rows", "CalcVParam", "members (name@row_offset)")
        rows = [
            (
                p.name + (" (forced)" if p.forced else ""),
                str(p.dim),
                p.dtype,
                p.optimizer_layout,
                f"{p.num_rows:,}",
                f"{p.calc_vparam:,.1f}",
                ", ".join(f"{m.name}@{m.row_offset}" for m in p.members),
            )
            for p in self.packed_tables
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        right = {1, 4, 5}
        for r in [header, *rows]:
            cells = [r[i].rjust(w) if i in right else r[i].ljust(w) for i, w in enumerate(widths)]
            lines.append("  " + "  ".join(cells) + "  " + r[-1])
        if self.unpacked:
            lines.append("unpacked tables:")
            for u in self.unpacked:
                t = self.table(u.name)
                lines.append(
                    f"  {t.name}  (dim {t.dim}, {t.dtype}, {t.optimizer_layout}, {t.num_rows:,} rows): {u.reason}"
                )
        return "\n".join(lines)


@dataclass
class _Group:
    name: str
    members: list[TableSpec]
    forced: bool


def _check_exclude(exclude: Iterable[str], specs: Mapping[str, TableSpec]) -> set[str]:
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of table names, got the string {exclude!r}; use [{exclude!r}].")
    out = set()
    for name in exclude:
        if name not in specs:
            raise ValueError(f"exclude names table {name!r}, which is not one of the tables; check the name.")
        out.add(name)
    return out


def _describe_key(key: tuple[int, str, str]) -> str:
    return f"dim {key[0]}, {key[1]}, optimizer_layout {key[2]!r}"


def _check_force_groups(
    force_groups: Mapping[str, Iterable[str]] | None, specs: Mapping[str, TableSpec], excluded: set[str]
) -> list[_Group]:
    if force_groups is None:
        return []
    if not isinstance(force_groups, Mapping):
        kind = type(force_groups).__name__
        raise TypeError(f"force_groups must map group names to lists of table names, got {kind}.")
    owner: dict[str, str] = {}
    groups = []
    for gname, group_names in force_groups.items():
        where = f"force_groups[{gname!r}]"
        if not isinstance(gname, str) or not gname:
            raise ValueError(f"force_groups keys must be non-empty group names, got {gname!r}.")
        if isinstance(group_names, str) or not isinstance(group_names, Iterable):
            raise TypeError(
                f"{where} must be a list of table names, got {group_names!r}; use [{group_names!r}] for one table."
            )
        names = list(group_names)
        if not names:
            raise ValueError(f"{where} is empty; list the tables to pack together or drop the group.")
        for name in names:
            if name not in specs:
                raise ValueError(f"{where} names table {name!r}, which is not one of the tables; check the name.")
            if name in excluded:
                raise ValueError(
                    f"table {name!r} is both excluded and in {where}; remove it from exclude or from the group."
                )
            if owner.get(name) == gname:
                raise ValueError(f"{where} lists table {name!r} twice; list it once.")
            if name in owner:
                raise ValueError(
                    f"table {name!r} is in two forced groups, {owner[name]!r} and {gname!r}; "
                    "a table belongs to exactly one packed table, so keep it in one group."
                )
            owner[name] = gname
        members = [specs[n] for n in names]
        by_key: dict[tuple, list[str]] = {}
        for t in members:
            by_key.setdefault(t.pack_key, []).append(t.name)
        if len(by_key) > 1:
            parts = "; ".join(f"[{_describe_key(k)}]: {', '.join(v)}" for k, v in by_key.items())
            raise ValueError(
                f"{where} mixes tables that cannot share a packed table (members need the same dim, dtype and "
                f"optimizer_layout): {parts}. Split the group by these keys."
            )
        order = {n: i for i, n in enumerate(specs)}
        groups.append(_Group(gname, sorted(members, key=lambda t: order[t.name]), forced=True))
    return groups


def _unique_name(base: str, used: set[str]) -> str:
    name, i = base, 2
    while name in used:
        name, i = f"{base}_{i}", i + 1
    used.add(name)
    return name


def _auto_group_name(key: tuple[int, str, str]) -> str:
    dim, dtype, opt = key
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"packed_{dim}d_{dtype}_{opt}")


def _num_shards(value: float, others: list[float], average: float, group: _Group, max_shards: int) -> int:
    """Shards for a group of CalcVParam ``value``: 1 unless it is above the average over groups."""
    if group.forced or len(group.members) < 2 or not others or value <= average:
        return 1
    # Target per shard: the mean CalcVParam of the *other* groups (see plan_packing).
    target = math.fsum(others) / len(others)
    if target <= 0:
        return 1
    k = math.floor(value / target + 0.5)  # round half up: deterministic, no banker's rounding
    return max(1, min(k, max_shards, len(group.members)))


def _split_evenly(members: list[TableSpec], values: list[float], k: int) -> list[list[TableSpec]]:
    """Splits tables (kept whole) into ``k`` shards of near-equal total value.

    Longest-processing-time greedy: tables by decreasing value (ties: input
    order) go to the shard with the least value so far (ties: fewer tables,
    then lower index). Within 4/3 of the optimal largest shard; with equal
    tables every shard gets the same number of tables.
    """
    if k == 1:
        return [list(members)]
    loads = [0.0] * k
    bins: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(members)), key=lambda i: (-values[i], i)):
        j = min(range(k), key=lambda j: (loads[j], len(bins[j]), j))
        bins[j].append(i)
        loads[j] += values[i]
    shards = [sorted(b) for b in bins if b]
    shards.sort(key=lambda b: b[0])
    return [[members[i] for i in b] for b in shards]


def _packed_table(
    name: str, group: _Group, shard: int, num_shards: int, members: list[TableSpec], freqs: IdFrequencies
) -> PackedTable:
    offset, placed = 0, []
    for t in members:
        placed.append(PackedMember(t.name, offset, t.num_rows))
        offset += t.num_rows
    dim, dtype, opt = members[0].pack_key
    return PackedTable(
        name=name,
        group=group.name,
        shard=shard,
        num_shards=num_shards,
        dim=dim,
        dtype=dtype,
        optimizer_layout=opt,
        members=tuple(placed),
        num_rows=offset,
        calc_vparam=calc_vparam(members, freqs),
        forced=group.forced,
    )


def plan_packing(
    tables: Iterable[TableSpec],
    stats: Mapping[str, TableStats] | None = None,
    *,
    exclude: Iterable[str] = (),
    force_groups: Mapping[str, Iterable[str]] | None = None,
    max_shards: int = DEFAULT_MAX_SHARDS,
    shard_strategy: str = "mod",
    replicate_below_rows: int = 0,
) -> PackingPlan:
    """Plans D-packing groups and their CalcVParam shards (PICASSO §III.B).

    **Groups.** Tables of ``force_groups`` form the named groups (kept whole:
    the user decided). Every other non-excluded table joins the group of its
    ``(dim, dtype, optimizer_layout)``, named ``packed_<dim>d_<dtype>_<optimizer>``.
    Groups keep their members in input order.

    **Eq. 1.** ``CalcVParam(T) = N * sum_{t in T}(t_dim * sum_{ID in t} ID_freq)``
    for every group ``T``; ``N`` and ``ID_freq`` come from ``stats`` (warm-up)
    or, without stats, from uniform access with ``TableSpec.ids_per_sample``
    ids per example (see ``id_frequencies``). The value is the number of
    embedding floats the group gathers per step (per example).

    **Splitting.** The paper splits a group whose CalcVParam is above average
    evenly into shards, and gives one example: with uniform data, one packed
    operation for the dim-8 tables and *four* shards for the dim-32 tables. It
    leaves the shard count open; here a group ``g`` with
    ``CalcVParam(g) > mean over all groups`` gets
    ``k = round(CalcVParam(g) / mean CalcVParam of the other groups)`` shards
    (round half up), clamped to ``[1, min(max_shards, members)]``. The ratio
    to the *other* groups' mean reproduces the paper's example (4 shards); the
    ratio to the mean over all groups (2.5x the dim-8 value there) would give
    2. Groups that are not above average, forced groups, one-table groups and
    plans with a single group are not split. Tables stay whole: the shards are
    formed by a deterministic longest-processing-time greedy on per-table
    CalcVParam and named ``<group>_shard<i>``.

    Args:
        tables: the model's tables; names must be unique. Their order fixes
            the order of groups, members and row offsets.
        stats: warm-up statistics (``collect_stats``) for every non-excluded
            table, or None for uniform access.
        exclude: names of tables that keep their own lookup chain (listed in
            ``plan.unpacked`` as "excluded by user").
        force_groups: ``{group name: [table names]}``: pack exactly these
            tables together; members must share dim, dtype and
            optimizer_layout.
        max_shards: the most shards one group is split into, >= 1.
        shard_strategy: ``"mod"`` or ``"range"``: how a packed table's rows
            are spread over Horovod ranks (see ``PackingPlan``).
        replicate_below_rows: packed tables with fewer rows stay replicated
            and data-parallel under Horovod (0: shard every packed table).

    Returns:
        A ``PackingPlan``.

    Raises:
        ValueError: duplicate table names; ``exclude`` or ``force_groups``
            naming an unknown table; a table in two forced groups, or both
            excluded and forced; a forced group mixing dims, dtypes or
            optimizer layouts (the message lists the tables per key);
            ``stats`` missing a table; bad ``max_shards``.
        TypeError: arguments of the wrong kind (e.g. ``exclude="a"``).

    Example:
        >>> ts = [TableSpec(f"e{i}", 1000, 8) for i in range(4)] + [TableSpec(f"w{i}", 1000, 32) for i in range(4)]
        >>> plan = plan_packing(ts)
        >>> [(p.name, p.member_names) for p in plan.packed_tables][:3]
        [('packed_8d_float32_sgd', ['e0', 'e1', 'e2', 'e3']), ('packed_32d_float32_sgd_shard0', ['w0']), \
('packed_32d_float32_sgd_shard1', ['w1'])]
        >>> plan.num_lookup_chains
        5
    """
    specs = index_tables(tables)
    if isinstance(max_shards, bool) or not isinstance(max_shards, int) or max_shards < 1:
        raise ValueError(f"max_shards must be an int >= 1, got {max_shards!r}.")
    excluded = _check_exclude(exclude, specs)
    groups = _check_force_groups(force_groups, specs, excluded)
    order = {n: i for i, n in enumerate(specs)}

    used_names = {g.name for g in groups}
    forced_members = {t.name for g in groups for t in g.members}
    auto: dict[tuple, _Group] = {}
    for t in specs.values():
        if t.name in excluded or t.name in forced_members:
            continue
        if t.pack_key not in auto:
            auto[t.pack_key] = _Group(_unique_name(_auto_group_name(t.pack_key), used_names), [], forced=False)
        auto[t.pack_key].members.append(t)
    groups = sorted([*groups, *auto.values()], key=lambda g: order[g.members[0].name])

    packable = [t for t in specs.values() if t.name not in excluded]
    freqs = id_frequencies(packable, stats)
    values = [calc_vparam(g.members, freqs) for g in groups]  # CalcVParam(T) per D-packing group T
    average = math.fsum(values) / len(values) if values else 0.0

    packed = []
    for gi, g in enumerate(groups):
        others = values[:gi] + values[gi + 1 :]
        k = _num_shards(values[gi], others, average, g, max_shards)
        shards = _split_evenly(g.members, [calc_vparam([t], freqs) for t in g.members], k)
        for si, members in enumerate(shards):
            name = g.name if len(shards) == 1 else _unique_name(f"{g.name}_shard{si}", used_names)
            packed.append(_packed_table(name, g, si, len(shards), members, freqs))
    packed.sort(key=lambda p: order[p.members[0].name])
    unpacked = [UnpackedTable(n, EXCLUDED_BY_USER) for n in specs if n in excluded]
    return PackingPlan(
        tables=tuple(specs.values()),
        packed_tables=tuple(packed),
        unpacked=tuple(unpacked),
        vparam_source=freqs.source,
        average_vparam=average,
        max_shards=max_shards,
        shard_strategy=shard_strategy,
        replicate_below_rows=replicate_below_rows,
    )

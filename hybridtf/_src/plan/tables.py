"""What the packing planner works on and what it produces: table specs and packed tables.

* ``TableSpec``: one embedding table of the user's model (one feature field).
* ``PackedMember``: where one table's rows live inside a packed table.
* ``PackedTable``: one packed table (one lookup chain after the rewrite): a
  D-packing group, or one shard of a group.
* ``UnpackedTable``: a table that keeps its own lookup chain, with the reason.

All of them are frozen dataclasses of plain values, so plans compare with
``==`` and serialize to JSON. TensorFlow-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hybridtf._src.limits import INT64_MAX

DTYPES = ("float16", "bfloat16", "float32", "float64")
COMBINERS = ("none", "sum", "mean", "sqrtn")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class TableSpec:
    """One embedding table (one feature field) as the planner sees it.

    Attributes:
        name: unique name of the table in the model.
        num_rows: rows of the table (its vocabulary size), > 0. Ids are in
            ``[0, num_rows)``; a packed table stores the rows of its members
            one after the other.
        dim: embedding dimension, > 0.
        dtype: dtype of the embedding values, one of ``DTYPES``.
        optimizer_layout: key of the optimizer's slot layout for this table
            (e.g. ``"sgd"``, ``"adagrad"``, ``"adam"``). Tables share a packed
            table only when the keys are equal, because one fused sparse update
            per packed table must update the same slots for all members.
        combiner: ``"none"`` for one-hot lookups (one output row per id),
            ``"sum"``, ``"mean"`` or ``"sqrtn"`` for multi-hot lookups.
        ids_per_sample: average ids one example looks up in this table, > 0.
            Used by the planner when no warm-up statistics are given.

    Raises:
        ValueError: a field is out of range; the message names the table and
            the fix.

    Example:
        >>> spec = TableSpec("user_id", num_rows=1000, dim=16, optimizer_layout="adagrad")
        >>> spec.pack_key
        (16, 'float32', 'adagrad')
    """

    name: str
    num_rows: int
    dim: int
    dtype: str = "float32"
    optimizer_layout: str = "sgd"
    combiner: str = "none"
    ids_per_sample: float = 1.0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TableSpec.name must be a non-empty string, got {self.name!r}.")
        where = f"TableSpec {self.name!r}"
        if not _is_int(self.num_rows) or not 0 < self.num_rows <= INT64_MAX:
            raise ValueError(
                f"{where}: num_rows must be a positive int (at most 2**63 - 1), got {self.num_rows!r}. "
                "Pass the table's vocabulary size (number of embedding rows)."
            )
        if not _is_int(self.dim) or not 0 < self.dim <= INT64_MAX:
            raise ValueError(
                f"{where}: dim must be a positive int (at most 2**63 - 1), got {self.dim!r}. Pass the embedding width."
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"{where}: dtype must be one of {DTYPES}, got {self.dtype!r}.")
        if not isinstance(self.optimizer_layout, str) or not self.optimizer_layout:
            raise ValueError(
                f"{where}: optimizer_layout must be a non-empty string key such as 'sgd', 'adagrad' or 'adam', "
                f"got {self.optimizer_layout!r}."
            )
        if self.combiner not in COMBINERS:
            raise ValueError(
                f"{where}: combiner must be one of {COMBINERS} ('none' for one-hot lookups), got {self.combiner!r}."
            )
        if not _is_number(self.ids_per_sample) or not math.isfinite(self.ids_per_sample) or self.ids_per_sample <= 0:
            raise ValueError(
                f"{where}: ids_per_sample must be a finite number > 0 (average ids per example), "
                f"got {self.ids_per_sample!r}."
            )
        # Normalize NumPy scalars so that specs compare equal and serialize to JSON.
        object.__setattr__(self, "num_rows", int(self.num_rows))
        object.__setattr__(self, "dim", int(self.dim))
        object.__setattr__(self, "ids_per_sample", float(self.ids_per_sample))

    @property
    def pack_key(self) -> tuple[int, str, str]:
        """What tables must share to be D-packed: ``(dim, dtype, optimizer_layout)``."""
        return (self.dim, self.dtype, self.optimizer_layout)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "num_rows": self.num_rows,
            "dim": self.dim,
            "dtype": self.dtype,
            "optimizer_layout": self.optimizer_layout,
            "combiner": self.combiner,
            "ids_per_sample": self.ids_per_sample,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TableSpec:
        return cls(**d)


@dataclass(frozen=True)
class PackedMember:
    """Where a table's rows live in its packed table.

    Row ``i`` of table ``name`` is row ``row_offset + i`` of the packed table.

    Attributes:
        name: the member table.
        row_offset: first row of the member inside the packed table.
        num_rows: rows of the member.
    """

    name: str
    row_offset: int
    num_rows: int

    def to_dict(self) -> dict:
        return {"name": self.name, "row_offset": self.row_offset, "num_rows": self.num_rows}


@dataclass(frozen=True)
class PackedTable:
    """One packed table: the member tables' rows stacked in one variable, one lookup chain.

    Attributes:
        name: unique name of the packed table in the plan.
        group: the D-packing group it comes from (equal to ``name`` unless the
            group was split into shards).
        shard: index of this shard in its group, ``0 .. num_shards - 1``.
        num_shards: number of shards the group was split into (1: not split).
        dim, dtype, optimizer_layout: shared by all members.
        members: member tables in row order, contiguous from row 0.
        num_rows: total rows, the sum of the members' rows.
        calc_vparam: CalcVParam (PICASSO Eq. 1) of this packed table.
        forced: True when the user forced the group with ``force_groups``.

    Raises:
        ValueError: members are empty, not contiguous from 0, or do not add up
            to ``num_rows`` (e.g. a hand-edited plan).
    """

    name: str
    group: str
    shard: int
    num_shards: int
    dim: int
    dtype: str
    optimizer_layout: str
    members: tuple[PackedMember, ...]
    num_rows: int
    calc_vparam: float
    forced: bool = False

    def __post_init__(self):
        object.__setattr__(self, "members", tuple(self.members))
        if not self.members:
            raise ValueError(f"packed table {self.name!r} has no members; every packed table needs at least one table.")
        offset = 0
        for m in self.members:
            if m.row_offset != offset or m.num_rows <= 0:
                raise ValueError(
                    f"packed table {self.name!r}: member {m.name!r} has row_offset {m.row_offset} and "
                    f"num_rows {m.num_rows}, but members must be contiguous from row 0 (expected row_offset {offset})."
                )
            offset += m.num_rows
        if offset != self.num_rows:
            raise ValueError(
                f"packed table {self.name!r}: num_rows is {self.num_rows} but its members have {offset} rows in all."
            )
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"packed table {self.name!r}: shard {self.shard} is not in [0, {self.num_shards}).")

    @property
    def member_names(self) -> list[str]:
        return [m.name for m in self.members]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "group": self.group,
            "shard": self.shard,
            "num_shards": self.num_shards,
            "dim": self.dim,
            "dtype": self.dtype,
            "optimizer_layout": self.optimizer_layout,
            "num_rows": self.num_rows,
            "calc_vparam": self.calc_vparam,
            "forced": self.forced,
            "members": [m.to_dict() for m in self.members],
        }

    @classmethod
    def from_dict(cls, d: dict) -> PackedTable:
        d = dict(d)
        d["members"] = tuple(PackedMember(**m) for m in d["members"])
        return cls(**d)


@dataclass(frozen=True)
class UnpackedTable:
    """A table that keeps its own lookup chain.

    Attributes:
        name: the table.
        reason: why it is not packed (e.g. ``"excluded by user"``).
    """

    name: str
    reason: str = field(default="excluded by user")

    def to_dict(self) -> dict:
        return {"name": self.name, "reason": self.reason}

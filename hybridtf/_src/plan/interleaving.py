"""The interleaving planner: K-interleaving groups (PICASSO Eq. 3) and micro-batches (Eq. 2).

Both equations take the same form, a bound on an operator's dominant hardware
resource over that operator's cost per unit of work::

    BS_micro   = min_op RBound_op / RInstance_op        (Eq. 2, per data instance)
    Capacity_g = min_op RBound_op / RParam_op           (Eq. 3, per parameter)

* ``micro_batch_size`` evaluates Eq. 2 for the step's peak memory: with a
  measured peak of ``P`` bytes at batch ``B`` and a memory bound ``R``, one
  instance costs ``P / B`` bytes and ``BS_micro = floor(R * B / P)``; the
  batch is cut into ``ceil(B / BS_micro)`` near-equal micro-batches.
* ``plan_interleaving`` evaluates Eq. 3 from per-chain warm-up costs
  (``ChainCost``: parameters a packed chain processes per step and what it
  costs in each resource, e.g. seconds) and cuts the packed chains, in plan
  order, into groups of at most ``Capacity_g`` parameters. The user can scale
  ``Capacity_g`` (more or fewer groups), set the number of groups directly,
  or exclude packed tables (their chains get no control dependencies).

The result, ``InterleavingPlan``, is plain data: it prints as a small table and
round-trips through JSON like the packing plan. TensorFlow-free.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

_JSON_FORMAT = "hybridtf.interleaving_plan"
_JSON_VERSION = 1
DEFAULT_MEMORY_FRACTION = 0.5


def is_count(value) -> bool:
    """An integer >= 1, Python's or NumPy's (not a bool: ``True`` is no number of micro-batches or groups)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= 1


@dataclass(frozen=True)
class ChainCost:
    """Warm-up cost of one packed chain (one packed table's lookups) per step.

    Attributes:
        name: the packed table.
        params: parameters (floats) it processes per step: distinct rows
            gathered times dim (PICASSO treats this volume as the cost of
            lookup and exchange).
        costs: measured use of each resource per step, e.g. ``{"seconds":
            0.004}`` (forward + backward time of the chain's ops).
    """

    name: str
    params: float
    costs: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "costs": dict(self.costs)}


@dataclass(frozen=True)
class InterleaveGroup:
    """One K-interleaving group: packed chains that run together, after the previous group's.

    Attributes:
        members: packed table names, in plan order.
        params: their parameters per step, summed.
    """

    members: tuple[str, ...]
    params: float

    def to_dict(self) -> dict:
        return {"members": list(self.members), "params": self.params}


@dataclass(frozen=True)
class MicroBatching:
    """How a step's batch is cut into micro-batches (D-interleaving), and why.

    Attributes:
        num_micro_batches: micro-batches per step (1: whole batch).
        interleave_from: ``"embedding"`` (whole forward per micro-batch),
            ``"mlp"`` (lookups once on the whole batch) or a layer name.
        source: ``"user"`` (a number was given) or ``"eq2"`` (chosen by Eq. 2).
        batch_size: the warm-up batch size Eq. 2 saw (0 when not measured).
        peak_bytes: the whole-batch step's measured peak memory.
        memory_bound: Eq. 2's ``RBound`` in bytes.
        micro_batch_size: Eq. 2's ``BS_micro`` (0 when not measured).
    """

    num_micro_batches: int
    interleave_from: str = "embedding"
    source: str = "user"
    batch_size: int = 0
    peak_bytes: float = 0.0
    memory_bound: float = 0.0
    micro_batch_size: int = 0

    def __post_init__(self):
        if not is_count(self.num_micro_batches):
            raise ValueError(
                f"num_micro_batches must be an int >= 1, got {self.num_micro_batches!r}; "
                "pass micro_batches=N or 'auto'."
            )

    @property
    def bytes_per_instance(self) -> float:
        """Eq. 2's ``RInstance``: peak bytes per example (0 when not measured)."""
        return self.peak_bytes / self.batch_size if self.batch_size else 0.0

    def to_dict(self) -> dict:
        return {
            "num_micro_batches": self.num_micro_batches,
            "interleave_from": self.interleave_from,
            "source": self.source,
            "batch_size": self.batch_size,
            "peak_bytes": self.peak_bytes,
            "memory_bound": self.memory_bound,
            "micro_batch_size": self.micro_batch_size,
        }

    def __str__(self) -> str:
        if self.num_micro_batches == 1 and self.source != "eq2":
            return "D-interleaving off: 1 micro-batch (the default; micro_batches=N or 'auto' splits the step)"
        text = f"D-interleaving from {self.interleave_from!r}: {self.num_micro_batches} micro-batches"
        if self.source == "eq2":
            text += (
                f" (Eq. 2: bound {self.memory_bound / 2**20:,.1f} MiB / {self.bytes_per_instance / 1024:,.2f} KiB per "
                f"instance (peak {self.peak_bytes / 2**20:,.1f} MiB at batch {self.batch_size:,}) -> "
                f"BS_micro = {self.micro_batch_size:,})"
            )
        return text


def default_memory_bound(fraction: float = DEFAULT_MEMORY_FRACTION, device_bytes: float | None = None) -> float:
    """Eq. 2's default ``RBound``: ``fraction`` of the device's memory (the GPU's, else the machine's RAM).

    Args:
        fraction: share of the memory the step may use, in (0, 1].
        device_bytes: the memory to take the share of; default: physical RAM.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction!r}.")
    if device_bytes is None:
        import os

        device_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return fraction * float(device_bytes)


def micro_batch_size(peak_bytes: float, batch_size: int, memory_bound: float) -> int:
    """PICASSO Eq. 2 for peak memory: ``BS_micro = RBound / RInstance`` with ``RInstance = peak / batch``.

    Returns at least 1 and at most ``batch_size``.

    Example:
        >>> micro_batch_size(peak_bytes=800e6, batch_size=65536, memory_bound=250e6)
        20480
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}.")
    if memory_bound <= 0:
        raise ValueError(f"memory bound must be > 0 bytes, got {memory_bound!r}.")
    if peak_bytes <= 0:
        return batch_size
    per_instance = peak_bytes / batch_size
    return max(1, min(batch_size, int(memory_bound // per_instance)))


def choose_micro_batches(
    peak_bytes: float, batch_size: int, memory_bound: float, interleave_from: str = "embedding"
) -> MicroBatching:
    """Eq. 2's choice: the fewest even micro-batches of at most ``BS_micro`` examples each."""
    bs = micro_batch_size(peak_bytes, batch_size, memory_bound)
    return MicroBatching(
        num_micro_batches=max(1, math.ceil(batch_size / bs)),
        interleave_from=interleave_from,
        source="eq2",
        batch_size=int(batch_size),
        peak_bytes=float(peak_bytes),
        memory_bound=float(memory_bound),
        micro_batch_size=bs,
    )


def capacity_g(bounds: Mapping[str, float], chains: Sequence[ChainCost]) -> float:
    """PICASSO Eq. 3: ``min_r RBound_r / RParam_r``; ``RParam_r`` = resource ``r`` per parameter over all chains.

    Resources without a bound or without a measured cost are skipped; with
    none left, the capacity is unbounded (``inf``: one group).

    Example:
        >>> capacity_g({"seconds": 0.01}, [ChainCost("a", 1000, {"seconds": 0.02})])
        500.0
    """
    total = sum(c.params for c in chains)
    capacity = math.inf
    for resource, bound in bounds.items():
        used = sum(c.costs.get(resource, 0.0) for c in chains)
        if bound > 0 and used > 0 and total > 0:
            capacity = min(capacity, bound / (used / total))
    return capacity


def _cut(chains: Sequence[ChainCost], limit: float) -> list[list[ChainCost]]:
    groups: list[list[ChainCost]] = []
    load = 0.0
    for c in chains:
        if groups and load + c.params <= limit * (1 + 1e-9):
            groups[-1].append(c)
            load += c.params
        else:
            groups.append([c])
            load = c.params
    return groups


def _cut_into(chains: Sequence[ChainCost], k: int) -> list[list[ChainCost]]:
    """Contiguous groups, as balanced by parameters as a greedy cut allows, exactly ``min(k, len)`` of them."""
    k = min(k, len(chains))
    groups: list[list[ChainCost]] = []
    rest = list(chains)
    for g in range(k, 0, -1):
        target = sum(c.params for c in rest) / g
        take, load = 1, rest[0].params
        while len(rest) - take >= g and load + rest[take].params / 2 <= target:
            load += rest[take].params
            take += 1
        if g == 1:
            take = len(rest)
        groups.append(rest[:take])
        rest = rest[take:]
    return groups


@dataclass(frozen=True)
class InterleavingPlan:
    """K-interleaving groups (Eq. 3) and the micro-batching (Eq. 2) a model runs with.

    Attributes:
        groups: groups of packed chains, in order: group ``g``'s chain stages
            run after group ``g - 1``'s (control dependencies).
        excluded: packed tables with no control dependencies.
        capacity: ``Capacity_g`` in parameters per step after ``scale``
            (``inf``: unbounded).
        scale: the user's factor on Eq. 3's capacity.
        source: ``"eq3"``, ``"num_groups"`` (the user fixed the count) or
            ``"user"`` (groups given).
        bounds: Eq. 3's ``RBound`` per resource.
        chains: the warm-up costs the plan was made from.
        micro: the micro-batching, or None (whole batch).

    Example:
        >>> chains = [ChainCost("a", 100, {"seconds": 1.0}), ChainCost("b", 100, {"seconds": 1.0})]
        >>> plan = plan_interleaving(chains, bounds={"seconds": 1.0})
        >>> [g.members for g in plan.groups]
        [('a',), ('b',)]
    """

    groups: tuple[InterleaveGroup, ...]
    excluded: tuple[str, ...] = ()
    capacity: float = math.inf
    scale: float = 1.0
    source: str = "user"
    bounds: Mapping[str, float] = field(default_factory=dict)
    chains: tuple[ChainCost, ...] = ()
    micro: MicroBatching | None = None

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "excluded", tuple(self.excluded))
        object.__setattr__(self, "chains", tuple(self.chains))
        seen: set[str] = set()
        for name in [m for g in self.groups for m in g.members] + list(self.excluded):
            if name in seen:
                raise ValueError(f"interleaving plan names packed table {name!r} twice; each belongs to one group.")
            seen.add(name)
        if any(not g.members for g in self.groups):
            raise ValueError("interleaving plan has an empty group; remove it.")

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def group_of(self, packed_table: str) -> int | None:
        """Index of the group holding ``packed_table``; None for excluded or unknown tables."""
        for i, g in enumerate(self.groups):
            if packed_table in g.members:
                return i
        return None

    def with_micro(self, micro: MicroBatching | None) -> InterleavingPlan:
        return InterleavingPlan(
            self.groups, self.excluded, self.capacity, self.scale, self.source, self.bounds, self.chains, micro
        )

    def to_dict(self) -> dict:
        return {
            "format": _JSON_FORMAT,
            "version": _JSON_VERSION,
            "groups": [g.to_dict() for g in self.groups],
            "excluded": list(self.excluded),
            "capacity": None if math.isinf(self.capacity) else self.capacity,
            "scale": self.scale,
            "source": self.source,
            "bounds": dict(self.bounds),
            "chains": [c.to_dict() for c in self.chains],
            "micro": None if self.micro is None else self.micro.to_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The plan as JSON (``InterleavingPlan.from_json`` reads it back to an equal plan)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping) -> InterleavingPlan:
        if d.get("format") != _JSON_FORMAT or d.get("version") != _JSON_VERSION:
            raise ValueError(
                f"not a hybridtf interleaving plan of version {_JSON_VERSION} (format={d.get('format')!r}). "
                "Write plans with InterleavingPlan.to_json."
            )
        try:
            return cls(
                groups=[InterleaveGroup(tuple(g["members"]), float(g["params"])) for g in d["groups"]],
                excluded=tuple(d["excluded"]),
                capacity=math.inf if d["capacity"] is None else float(d["capacity"]),
                scale=float(d["scale"]),
                source=d["source"],
                bounds={k: float(v) for k, v in d["bounds"].items()},
                chains=[ChainCost(c["name"], float(c["params"]), dict(c["costs"])) for c in d["chains"]],
                micro=None if d.get("micro") is None else MicroBatching(**d["micro"]),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"malformed interleaving plan: {err!r}. Write plans with InterleavingPlan.to_json."
            ) from err

    @classmethod
    def from_json(cls, s: str) -> InterleavingPlan:
        """Reads a plan written by ``to_json``."""
        return cls.from_dict(json.loads(s))

    def __str__(self) -> str:
        cap = "unbounded" if math.isinf(self.capacity) else f"{self.capacity:,.0f} params/step"
        how = {
            "eq3": "Eq. 3",
            "num_groups": "number of groups set by interleave_groups, at most one per packed table",
            "user": "groups given",
        }
        if self.source == "num_groups" and self.num_groups == 1:
            how["num_groups"] = "interleave_groups=1, the default, or one packed table: no K-interleaving"
        if self.num_groups == 0:
            lines = ["InterleavingPlan: no K-interleaving groups (no packed static table's chain to group)"]
        else:
            lines = [
                f"InterleavingPlan: {self.num_groups} K-interleaving groups ({how.get(self.source, self.source)}); "
                f"Capacity_g {cap}" + (f" (scaled x{self.scale:g})" if self.scale != 1 else "")
            ]
        seconds = {c.name: c.costs.get("seconds") for c in self.chains}
        for i, g in enumerate(self.groups):
            measured = [seconds.get(m) for m in g.members]
            timing = (
                f"  (warm-up op time {sum(measured) * 1e3:,.3f} ms)" if all(t is not None for t in measured) else ""
            )
            lines.append(f"  group {i}: {g.params:,.0f} params/step{timing}  {', '.join(g.members)}")
        if "seconds" in self.bounds:
            lines.append(
                f"  RBound (seconds): {self.bounds['seconds'] * 1e3:,.3f} ms of non-embedding op time per step"
            )
        if self.excluded:
            lines.append(f"  excluded (no control dependencies): {', '.join(self.excluded)}")
        if self.micro is not None:
            lines.append("  " + str(self.micro))
        return "\n".join(lines)


def plan_interleaving(
    chains: Sequence[ChainCost],
    *,
    bounds: Mapping[str, float] | None = None,
    scale: float = 1.0,
    num_groups: int | None = None,
    exclude: Iterable[str] = (),
    micro: MicroBatching | None = None,
) -> InterleavingPlan:
    """K-interleaving groups of packed chains by PICASSO Eq. 3.

    Args:
        chains: warm-up cost of every packed chain, in plan order.
        bounds: ``RBound`` per resource (same keys as ``ChainCost.costs``).
        scale: multiplies ``Capacity_g`` (the paper's "proportionally modify
            Capacity_g"): below 1 gives more, smaller groups.
        num_groups: the number of groups, directly (overrides Eq. 3).
        exclude: packed tables that get no control dependencies.
        micro: the micro-batching to record with the plan.

    Raises:
        ValueError: an unknown excluded name, ``scale <= 0`` or
            ``num_groups < 1``.
    """
    names = [c.name for c in chains]
    excluded = tuple(exclude)
    unknown = [n for n in excluded if n not in names]
    if unknown:
        raise ValueError(f"interleave_exclude names {unknown}, which are not packed tables; the plan has {names}.")
    if not scale > 0:
        raise ValueError(f"Capacity_g scale must be > 0, got {scale!r}.")
    if num_groups is not None and (not isinstance(num_groups, int) or num_groups < 1):
        raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}.")
    bounds = dict(bounds or {})
    kept = [c for c in chains if c.name not in excluded]
    capacity = capacity_g(bounds, kept) * scale
    if not kept:
        cut, source = [], "eq3"
    elif num_groups is not None:
        cut, source = _cut_into(kept, num_groups), "num_groups"
    else:
        cut, source = _cut(kept, capacity), "eq3"
    groups = [InterleaveGroup(tuple(c.name for c in g), float(sum(c.params for c in g))) for g in cut]
    return InterleavingPlan(groups, excluded, capacity, float(scale), source, bounds, tuple(chains), micro)

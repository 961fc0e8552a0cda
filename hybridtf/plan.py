"""The packing plan (public API): which tables share a packed table, and how.

A plan is a plain object: print it, save it with ``to_json``, edit it, load it
with ``PackingPlan.from_json`` and pass it to ``hybridtf.keras.optimize(model,
plan=...)``. ``collect_stats`` turns warm-up id batches into the per-table
statistics that refine CalcVParam (PICASSO Eq. 1). ``plan_interleaving`` (Eq. 3)
and ``choose_micro_batches`` (Eq. 2) make the ``InterleavingPlan``, printable and
JSON like the packing plan.

Example:
    >>> specs = [TableSpec("user", 1000, 16), TableSpec("item", 5000, 16), TableSpec("ctx", 50, 8)]
    >>> plan = plan_packing(specs)
    >>> print(plan)
    >>> same = PackingPlan.from_json(plan.to_json())
"""

from hybridtf._src.plan.interleaving import (
    ChainCost,
    InterleaveGroup,
    InterleavingPlan,
    MicroBatching,
    capacity_g,
    choose_micro_batches,
    micro_batch_size,
    plan_interleaving,
)
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.plan.sharding import even_range_bounds
from hybridtf._src.plan.stats import TableStats, calc_vparam, collect_stats
from hybridtf._src.plan.tables import PackedMember, PackedTable, TableSpec, UnpackedTable

__all__ = [
    "ChainCost",
    "InterleaveGroup",
    "InterleavingPlan",
    "MicroBatching",
    "PackedMember",
    "PackedTable",
    "PackingPlan",
    "TableSpec",
    "TableStats",
    "UnpackedTable",
    "calc_vparam",
    "capacity_g",
    "choose_micro_batches",
    "collect_stats",
    "even_range_bounds",
    "micro_batch_size",
    "plan_interleaving",
    "plan_packing",
]

"""K-interleaving (PICASSO §III-C, Eq. 3, Fig. 8 c): control dependencies between groups of packed chains.

A packed chain runs in stages (one process: pack ids -> Unique&Partition ->
gather -> stitch; Horovod: pack ids -> [id agreement] -> partition by owner ->
exchange: alltoall ids, local gather, alltoall rows -> stitch). With an
``InterleavingPlan``, the pack, unique and gather/exchange stages of a chain in
group ``g`` get control dependencies on the same stage's outputs of all chains
in group ``g - 1``:
the groups run as a pipeline (group ``g`` packs and deduplicates while group
``g - 1`` exchanges), instead of every chain's collective or memory-bound
kernel starting at once. Stitching gets no dependencies: a chain's stitched
outputs may be fused away (StitchConcat, StitchConcatMatMul read the rows
directly) and are then pruned by TensorFlow; a control edge on them would
keep them alive. Because the dependencies follow the plan, and every
rank builds the same graph from the same plan, every rank enqueues the
alltoalls in the same group order. Excluded packed tables (and tables the plan
does not name) get no dependencies. The math is unchanged: only the order in
which independent ops may start changes, so results are bit-identical.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from hybridtf._src.plan.interleaving import ChainCost, InterleavingPlan, plan_interleaving
from hybridtf._src.plan.packing import PackingPlan

# Stage names used by the runtime, in chain order ("exchange" is the gather in one process).
STAGES = ("pack", "unique", "exchange")


def _tensors(value) -> list[tf.Tensor]:
    if value is None:
        return []
    if hasattr(value, "__dataclass_fields__"):
        value = [getattr(value, f) for f in value.__dataclass_fields__]
    flat = tf.nest.flatten(value, expand_composites=True)
    return [t for t in flat if isinstance(t, tf.Tensor)]


class GroupOrder:
    """Adds K-interleaving control dependencies while the runtime builds the chains.

    Usage, per packed table ``name`` and stage ``s`` (tables of group ``g - 1``
    must be built before those of group ``g``: see ``order``)::

        with order.stage(name, s):
            out = build_stage(...)
        order.done(name, s, out)

    Args:
        plan: the interleaving plan; None: no dependencies at all.
    """

    def __init__(self, plan: InterleavingPlan | None):
        self.plan = plan
        self._outputs: dict[tuple[int, str], list[tf.Tensor]] = {}

    def group(self, name: str) -> int | None:
        return None if self.plan is None else self.plan.group_of(name)

    def order(self, names: list[str]) -> list[str]:
        """``names`` with excluded/unknown tables first, then by group (stable inside a group)."""
        return sorted(names, key=lambda n: -1 if self.group(n) is None else self.group(n))

    @contextlib.contextmanager
    def stage(self, name: str, stage: str):
        g = self.group(name)
        deps = self._outputs.get((g - 1, stage), []) if g else []
        if deps and not tf.executing_eagerly():
            with tf.control_dependencies(deps):
                yield
        else:
            yield

    def done(self, name: str, stage: str, value) -> None:
        g = self.group(name)
        if g is not None:
            self._outputs.setdefault((g, stage), []).extend(_tensors(value))


def same_group(plan: InterleavingPlan | None, a: str, b: str) -> bool:
    """Whether packed tables ``a`` and ``b`` may share a chain's unique ids (always without a plan)."""
    return plan is None or plan.group_of(a) == plan.group_of(b)


def packed_names(packing: PackingPlan, names) -> tuple[str, ...]:
    """Excluded embeddings, named by table (layer) or packed table, as packed table names.

    Raises:
        PlanKeyError: a name that is neither (the message names it).
    """
    packed = {pt.name for pt in packing.packed_tables}
    out: list[str] = []
    for given in names:
        name = given if given in packed else packing.location(given)[0]
        if name not in out:
            out.append(name)
    return tuple(out)


def static_plan(packing: PackingPlan, groups, exclude=(), bounds=None, micro=None) -> InterleavingPlan:
    """An interleaving plan without warm-up: ``groups`` groups balanced by CalcVParam, or a given plan.

    Args:
        packing: the packing plan (its packed tables are the chains).
        groups: None or an int (number of groups), or an ``InterleavingPlan``
            (checked against ``packing`` and returned).
        exclude: embedding or packed table names without control dependencies.
        bounds: Eq. 3 bounds to record (no costs are measured here).
        micro: the micro-batching to record.

    Raises:
        ValueError: a plan naming tables that are not packed tables.
    """
    if isinstance(groups, InterleavingPlan):
        plan = groups
    else:
        chains = [ChainCost(pt.name, float(pt.calc_vparam)) for pt in packing.packed_tables]
        plan = plan_interleaving(
            chains, num_groups=groups or 1, exclude=packed_names(packing, exclude), bounds=bounds, micro=micro
        )
    have = {pt.name for pt in packing.packed_tables}
    unknown = [n for g in plan.groups for n in g.members if n not in have] + [n for n in plan.excluded if n not in have]
    if unknown:
        raise ValueError(
            f"the interleaving plan names {unknown}, which are not packed tables of this model; it has {sorted(have)}."
        )
    return plan

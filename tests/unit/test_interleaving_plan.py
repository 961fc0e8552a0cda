"""The interleaving planner: Eq. 2 (micro-batch size), Eq. 3 (Capacity_g groups), JSON round trip."""

from __future__ import annotations

import math

import pytest

from hybridtf._src.plan.interleaving import (
    ChainCost,
    InterleavingPlan,
    MicroBatching,
    capacity_g,
    choose_micro_batches,
    default_memory_bound,
    micro_batch_size,
    plan_interleaving,
)


def _chains():
    return [
        ChainCost("a", 400, {"seconds": 0.4}),
        ChainCost("b", 300, {"seconds": 0.3}),
        ChainCost("c", 200, {"seconds": 0.2}),
        ChainCost("d", 100, {"seconds": 0.1}),
    ]


def test_eq2_micro_batch_size():
    # 800 bytes per instance, bound 250 * 800 bytes -> 250 instances per micro-batch.
    assert micro_batch_size(peak_bytes=800_000, batch_size=1000, memory_bound=200_000) == 250
    assert micro_batch_size(peak_bytes=800_000, batch_size=1000, memory_bound=10**9) == 1000  # fits whole
    assert micro_batch_size(peak_bytes=800_000, batch_size=1000, memory_bound=1) == 1
    m = choose_micro_batches(800_000, 1000, 300_000, "mlp")
    assert (m.micro_batch_size, m.num_micro_batches, m.source) == (375, 3, "eq2")
    assert m.bytes_per_instance == 800
    assert "Eq. 2" in str(m) and "'mlp'" in str(m)
    with pytest.raises(ValueError, match="memory bound"):
        micro_batch_size(1, 10, 0)
    with pytest.raises(ValueError, match="num_micro_batches"):
        MicroBatching(0)


def test_default_memory_bound_is_a_fraction_of_ram():
    assert default_memory_bound(0.5, device_bytes=1000) == 500
    assert 0 < default_memory_bound(0.25) < default_memory_bound(0.5)
    with pytest.raises(ValueError, match="fraction"):
        default_memory_bound(1.5)


def test_eq3_capacity_and_groups():
    chains = _chains()
    # 1e-3 s per parameter; a bound of 0.5 s -> 500 parameters per group.
    assert capacity_g({"seconds": 0.5}, chains) == pytest.approx(500)
    assert capacity_g({}, chains) == math.inf
    plan = plan_interleaving(chains, bounds={"seconds": 0.5})
    assert [g.members for g in plan.groups] == [("a",), ("b", "c"), ("d",)]
    assert [g.params for g in plan.groups] == [400, 500, 100]
    assert plan.group_of("c") == 1 and plan.group_of("zz") is None
    # Scaling Capacity_g: twice as large -> fewer groups.
    bigger = plan_interleaving(chains, bounds={"seconds": 0.5}, scale=2)
    assert [g.members for g in bigger.groups] == [("a", "b", "c", "d")]
    assert bigger.capacity == pytest.approx(1000)
    # No bound: one group.
    assert plan_interleaving(chains).num_groups == 1


def test_explicit_num_groups_and_exclusion():
    chains = _chains()
    plan = plan_interleaving(chains, num_groups=2, exclude=["b"])
    assert plan.source == "num_groups" and plan.excluded == ("b",)
    assert [g.members for g in plan.groups] == [("a",), ("c", "d")]
    assert plan.group_of("b") is None
    four = plan_interleaving(chains, num_groups=9)
    assert [g.members for g in four.groups] == [("a",), ("b",), ("c",), ("d",)]
    with pytest.raises(ValueError, match="not packed tables"):
        plan_interleaving(chains, exclude=["nope"])
    with pytest.raises(ValueError, match="num_groups"):
        plan_interleaving(chains, num_groups=0)
    with pytest.raises(ValueError, match="scale"):
        plan_interleaving(chains, scale=0)


def test_plan_prints_and_round_trips_json():
    micro = choose_micro_batches(8e8, 65536, 2.5e8, "mlp")
    plan = plan_interleaving(_chains(), bounds={"seconds": 0.5}, exclude=["d"], micro=micro)
    again = InterleavingPlan.from_json(plan.to_json())
    assert again == plan
    unbounded = plan_interleaving(_chains())
    assert InterleavingPlan.from_json(unbounded.to_json()) == unbounded
    text = str(plan)
    assert "group 0" in text and "excluded" in text and "Capacity_g" in text and "BS_micro" in text
    with pytest.raises(ValueError, match="interleaving plan"):
        InterleavingPlan.from_json('{"format": "x"}')
    with pytest.raises(ValueError, match="twice"):
        InterleavingPlan.from_dict({**plan.to_dict(), "excluded": ["a"]})


def test_plan_text_names_the_defaults_as_defaults():
    """One group and one micro-batch are what optimize does when asked nothing: the text says so."""
    one = plan_interleaving(_chains(), num_groups=1)
    assert "interleave_groups=1, the default, or one packed table: no K-interleaving" in str(one)
    assert "set by" not in str(one)
    assert "number of groups set by interleave_groups" in str(plan_interleaving(_chains(), num_groups=2))
    # more groups asked than packed tables: as many groups as tables, and the text does not claim the count
    many = plan_interleaving(_chains(), num_groups=50)
    assert many.num_groups == len(_chains()) and "at most one per packed table" in str(many)
    assert str(MicroBatching(1)).startswith("D-interleaving off: 1 micro-batch")
    assert str(MicroBatching(2, "mlp")) == "D-interleaving from 'mlp': 2 micro-batches"

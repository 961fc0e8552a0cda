"""Packing planner (plan stage): D-packing groups, CalcVParam (Eq. 1) shards, plan object."""

from __future__ import annotations

import ast
import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridtf._src.data.synthetic import zipf_ids
from hybridtf._src.errors import PlanKeyError
from hybridtf._src.plan import packing, stats, tables
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.plan.stats import TableStats, calc_vparam, collect_stats, id_frequencies
from hybridtf._src.plan.tables import TableSpec


def _spec(name, dim=8, rows=100, dtype="float32", opt="sgd", ids=1.0):
    return TableSpec(name, num_rows=rows, dim=dim, dtype=dtype, optimizer_layout=opt, ids_per_sample=ids)


def _check_layout(plan: PackingPlan):
    """Every table placed exactly once; members contiguous from 0; location agrees."""
    placed = Counter(m.name for p in plan.packed_tables for m in p.members)
    placed.update(u.name for u in plan.unpacked)
    assert placed == Counter(t.name for t in plan.tables)
    for p in plan.packed_tables:
        offset = 0
        for m in p.members:
            assert m.row_offset == offset
            assert m.num_rows == plan.table(m.name).num_rows
            assert plan.location(m.name) == (p.name, offset)
            assert plan.table(m.name).pack_key == (p.dim, p.dtype, p.optimizer_layout)
            offset += m.num_rows
        assert p.num_rows == offset
    assert plan.num_lookup_chains == len(plan.packed_tables) + len(plan.unpacked)


# --- TableSpec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_rows": 0}, r"'t'.*num_rows must be a positive int"),
        ({"num_rows": True}, r"'t'.*num_rows must be a positive int"),
        ({"dim": -1}, r"'t'.*dim must be a positive int"),
        ({"dtype": "int8"}, r"'t'.*dtype must be one of"),
        ({"optimizer_layout": ""}, r"'t'.*optimizer_layout must be a non-empty string"),
        ({"combiner": "max"}, r"'t'.*combiner must be one of"),
        ({"ids_per_sample": 0.0}, r"'t'.*ids_per_sample must be a finite number > 0"),
        ({"ids_per_sample": float("nan")}, r"'t'.*ids_per_sample must be a finite number > 0"),
    ],
)
def test_table_spec_rejects_bad_fields(kwargs, match):
    args = {"name": "t", "num_rows": 10, "dim": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        TableSpec(**args)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        TableSpec("", 10, 8)


def test_table_spec_normalizes_numpy_scalars():
    t = TableSpec("t", np.int64(10), np.int32(8), ids_per_sample=np.float32(2.0))
    assert t == TableSpec("t", 10, 8, ids_per_sample=2.0)
    assert type(t.num_rows) is int and type(t.dim) is int and type(t.ids_per_sample) is float


# --- D-packing ----------------------------------------------------------------------------------


def test_groups_by_dim_dtype_and_optimizer_layout():
    ts = [
        _spec("a", 8),
        _spec("b", 16),
        _spec("c", 8, dtype="float16"),
        _spec("d", 8),
        _spec("e", 8, opt="adam"),
        _spec("f", 16),
        _spec("g", 8, dtype="float16"),
    ]
    plan = plan_packing(ts, max_shards=1)  # grouping only
    got = [(p.name, p.member_names) for p in plan.packed_tables]
    assert got == [
        ("packed_8d_float32_sgd", ["a", "d"]),
        ("packed_16d_float32_sgd", ["b", "f"]),
        ("packed_8d_float16_sgd", ["c", "g"]),
        ("packed_8d_float32_adam", ["e"]),
    ]
    assert plan.unpacked == ()
    assert plan.num_lookup_chains == 4
    _check_layout(plan)


def test_excluded_tables_stay_unpacked_with_reason():
    ts = [_spec("a"), _spec("b"), _spec("c")]
    plan = plan_packing(ts, exclude=["b"])
    assert [p.member_names for p in plan.packed_tables] == [["a", "c"]]
    assert [(u.name, u.reason) for u in plan.unpacked] == [("b", "excluded by user")]
    assert plan.location("c") == ("packed_8d_float32_sgd", 100)
    assert plan.num_lookup_chains == 2
    with pytest.raises(KeyError, match=r"'b' is not packed \(excluded by user\)"):
        plan.location("b")
    with pytest.raises(PlanKeyError, match=r"'zz' is not in the plan"):
        plan.location("zz")


def test_forced_groups_are_kept_whole_and_named():
    ts = [_spec("a", 32), _spec("b", 32), _spec("c", 32), _spec("d", 32), _spec("e", 8), _spec("f", 8)]
    plan = plan_packing(ts, force_groups={"big": ["d", "a", "b", "c"]})
    big = plan.packed_table("big")
    assert big.forced and big.num_shards == 1
    assert big.member_names == ["a", "b", "c", "d"]  # input order, not the order in force_groups
    assert [p.member_names for p in plan.packed_tables] == [["a", "b", "c", "d"], ["e", "f"]]
    _check_layout(plan)


def test_forced_group_name_equal_to_an_automatic_name_gets_a_distinct_auto_name():
    ts = [_spec("a"), _spec("b"), _spec("c")]
    plan = plan_packing(ts, force_groups={"packed_8d_float32_sgd": ["a"]}, max_shards=1)
    assert [p.name for p in plan.packed_tables] == ["packed_8d_float32_sgd", "packed_8d_float32_sgd_2"]


# --- Eq. 1 --------------------------------------------------------------------------------------


def test_calc_vparam_on_a_hand_computed_example():
    a, b, c = _spec("a", 8, rows=10), _spec("b", 4, rows=10), _spec("c", 8, rows=10)
    batches = [
        {"a": np.array([1, 1, 2]), "b": np.array([[0, 0], [0, 0]]), "c": np.array([7])},  # any shape
        {"a": np.array([3]), "b": np.array([5, 5])},  # c absent: no ids this step
    ]
    s = collect_stats(batches, [a, b, c])
    # ids per table: a 4, b 6, c 1 over 2 steps -> N = 11 / 2 = 5.5 ids per step.
    # ID_freq = count / (steps * N): a {1: 2/11, 2: 1/11, 3: 1/11}, b {0: 4/11, 5: 2/11}, c {7: 1/11}.
    id_freq = {"a": [2 / 11, 1 / 11, 1 / 11], "b": [4 / 11, 2 / 11], "c": [1 / 11]}
    n = 5.5
    by_hand = {
        "ac": n * (8 * sum(id_freq["a"]) + 8 * sum(id_freq["c"])),  # = 20
        "b": n * (4 * sum(id_freq["b"])),  # = 12
        "a": n * 8 * sum(id_freq["a"]),  # = 16
        "c": n * 8 * sum(id_freq["c"]),  # = 4
    }
    assert by_hand["ac"] == pytest.approx(20.0) and by_hand["b"] == pytest.approx(12.0)
    freqs = id_frequencies([a, b, c], s)
    assert freqs.n == pytest.approx(n) and freqs.source == "warmup"
    for name in "abc":
        assert freqs.freq_sum[name] == pytest.approx(sum(id_freq[name]))
    assert calc_vparam([a, c], freqs) == pytest.approx(by_hand["ac"])
    assert calc_vparam([b], freqs) == pytest.approx(by_hand["b"])

    # Groups {a, c} = 20 and {b} = 12, average 16: {a, c} is above it and its ratio to the other
    # groups' mean is 20 / 12 -> 2 shards, {a} = 16 and {c} = 4.
    plan = plan_packing([a, b, c], s)
    assert plan.vparam_source == "warmup"
    assert plan.average_vparam == pytest.approx(16.0)
    got = {p.name: (p.member_names, p.calc_vparam) for p in plan.packed_tables}
    assert got.keys() == {"packed_8d_float32_sgd_shard0", "packed_8d_float32_sgd_shard1", "packed_4d_float32_sgd"}
    assert got["packed_8d_float32_sgd_shard0"][0] == ["a"]
    assert got["packed_8d_float32_sgd_shard0"][1] == pytest.approx(by_hand["a"])
    assert got["packed_8d_float32_sgd_shard1"][1] == pytest.approx(by_hand["c"])
    assert got["packed_4d_float32_sgd"][1] == pytest.approx(by_hand["b"])


def test_uniform_calc_vparam_uses_ids_per_sample():
    ts = [_spec("a", 8, ids=1.0), _spec("b", 8, ids=3.0), _spec("c", 16, ids=2.0)]
    freqs = id_frequencies(ts)
    assert freqs.source == "uniform" and freqs.n == 6.0
    assert calc_vparam(ts[:2], freqs) == pytest.approx(8 * 1 + 8 * 3)
    assert calc_vparam(ts, freqs) == pytest.approx(8 + 24 + 32)


# --- Splitting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n32", [4, 8])
def test_paper_example_dim32_group_becomes_four_shards(n32):
    # PICASSO §III.B: uniform data, one packed op for the dim-8 tables, four shards for dim 32.
    ts = [_spec(f"e{i}", 8) for i in range(n32)] + [_spec(f"w{i}", 32) for i in range(n32)]
    plan = plan_packing(ts)
    p8 = [p for p in plan.packed_tables if p.dim == 8]
    p32 = [p for p in plan.packed_tables if p.dim == 32]
    assert len(p8) == 1 and p8[0].num_shards == 1
    assert len(p32) == 4 and all(p.num_shards == 4 for p in p32)
    assert sorted(len(p.members) for p in p32) == [n32 // 4] * 4  # each a quarter of the tables
    assert {p.calc_vparam for p in p32} == {p8[0].calc_vparam}
    _check_layout(plan)


def test_balanced_split_of_a_skewed_group():
    # One heavy dim-16 group (per-table CalcVParam 16 * ids) against three light groups of 40 each.
    heavy = [_spec(f"h{i}", 16, ids=x) for i, x in enumerate([9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 3.0, 2.0, 1.0])]
    light = [_spec(f"l{d}", d, ids=40.0 / d) for d in (4, 8, 32)]
    plan = plan_packing(heavy + light)
    shards = [p for p in plan.packed_tables if p.dim == 16]
    # group 640 vs the others' mean 40 -> round(16) = 16, clamped to max_shards = 8.
    assert len(shards) == 8
    loads = sorted(p.calc_vparam for p in shards)
    total = 16 * 40.0
    assert sum(loads) == pytest.approx(total)
    # 9 tables into 8 shards: the two smallest (32 and 16) share a shard -> loads are the tables' values.
    assert loads == pytest.approx([16 * x for x in (3.0, 3.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0)])
    assert plan.max_shards == 8
    assert len(plan_packing(heavy + light, max_shards=3).packed_tables) == 3 + 3
    _check_layout(plan)


def test_not_split_when_not_above_average_or_single_group():
    assert plan_packing([_spec(f"t{i}", 64) for i in range(6)]).num_lookup_chains == 1
    ts = [_spec("a", 8), _spec("b", 8), _spec("c", 16)]  # both groups 16: equal, nothing above average
    assert [p.num_shards for p in plan_packing(ts).packed_tables] == [1, 1]
    ts = [_spec("a", 8), _spec("b", 8), _spec("c", 8), _spec("d", 8, opt="adam"), _spec("e", 8, opt="adam", ids=1.4)]
    # 24 vs 19.2: above average but round(24 / 19.2) = 1 -> not split.
    assert [p.num_shards for p in plan_packing(ts).packed_tables] == [1, 1]


table_sets = st.lists(
    st.tuples(
        st.integers(1, 10**6),  # rows
        st.sampled_from([4, 8, 16, 32]),
        st.sampled_from(["float32", "float16"]),
        st.sampled_from(["sgd", "adam"]),
        st.floats(0.1, 50.0),  # ids_per_sample
        st.integers(0, 10**6),  # warm-up ids_total
        st.booleans(),  # excluded
    ),
    min_size=1,
    max_size=40,
)


def _build(rows):
    ts = [
        _spec(f"t{i}", dim, rows=r, dtype=dt, opt=opt, ids=ids) for i, (r, dim, dt, opt, ids, _, _) in enumerate(rows)
    ]
    st_ = {
        f"t{i}": TableStats(steps=10, ids_total=n, distinct_total=n // 2, distinct_per_step=n / 20, max_id_count=n // 4)
        for i, (*_, n, _) in enumerate(rows)
    }
    excluded = [f"t{i}" for i, row in enumerate(rows) if row[-1]]
    return ts, st_, excluded


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table_sets, st.booleans(), st.integers(1, 8))
def test_plan_properties(rows, with_stats, max_shards):
    ts, st_, excluded = _build(rows)
    plan = plan_packing(ts, st_ if with_stats else None, exclude=excluded, max_shards=max_shards)
    _check_layout(plan)
    assert [u.name for u in plan.unpacked] == excluded
    groups: dict[str, list] = {}
    for p in plan.packed_tables:
        groups.setdefault(p.group, []).append(p)
    freqs = id_frequencies([t for t in ts if t.name not in excluded], st_ if with_stats else None)
    for shards in groups.values():
        assert len(shards) == shards[0].num_shards <= max_shards
        assert sorted(p.shard for p in shards) == list(range(len(shards)))
        members = [plan.table(n) for p in shards for n in p.member_names]
        value = calc_vparam(members, freqs)
        if len(shards) > 1:
            assert value > plan.average_vparam  # only above-average groups are split
            # Whole tables per shard, longest first (LPT): the largest shard is at most the average plus
            # (1 - 1/m) of the largest table (Graham's list-scheduling bound), and, where the best split can be
            # enumerated, at most (4/3 - 1/(3m)) of the best split's largest shard. (Not 4/3 of the lower bound
            # max(average, largest table), which the best split itself can exceed: 4 equal tables on 3 shards.)
            m, sizes = len(shards), [calc_vparam([t], freqs) for t in members]
            largest = max(p.calc_vparam for p in shards)
            assert largest <= (value / m + (1 - 1 / m) * max(sizes)) * (1 + 1e-9) + 1e-9
            if m ** len(sizes) <= 50_000:
                best = min(
                    max(math.fsum(s for s, k in zip(sizes, split) if k == j) for j in range(m))
                    for split in itertools.product(range(m), repeat=len(sizes))
                )
                assert largest <= (4 / 3 - 1 / (3 * m)) * best * (1 + 1e-9) + 1e-9
        assert math.fsum(p.calc_vparam for p in shards) == pytest.approx(value, rel=1e-9, abs=1e-9)


# --- JSON, printing, determinism ----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(table_sets, st.booleans())
def test_json_round_trip(rows, with_stats):
    ts, st_, excluded = _build(rows)
    plan = plan_packing(ts, st_ if with_stats else None, exclude=excluded)
    back = PackingPlan.from_json(plan.to_json())
    assert back == plan
    assert back.to_json() == plan.to_json()
    for t in ts:
        if t.name not in excluded:
            assert back.location(t.name) == plan.location(t.name)


def test_from_json_rejects_foreign_or_inconsistent_plans():
    plan = plan_packing([_spec("a"), _spec("b")])
    with pytest.raises(ValueError, match="not a hybridtf packing plan"):
        PackingPlan.from_json('{"format": "x"}')
    d = plan.to_dict()
    d["packed_tables"][0]["members"][1]["row_offset"] = 50
    with pytest.raises(ValueError, match="contiguous"):
        PackingPlan.from_dict(d)
    d = plan.to_dict()
    d["unpacked"] = [{"name": "a", "reason": "excluded by user"}]
    with pytest.raises(ValueError, match="'a' is placed twice"):
        PackingPlan.from_dict(d)


def test_printing_lists_every_table_and_reason():
    ts = [_spec(f"t{i}", 8 * (1 + i % 3), ids=1 + i % 4) for i in range(12)]
    plan = plan_packing(ts, exclude=["t5", "t7"])
    text = str(plan)
    for t in ts:
        assert t.name in text
    for p in plan.packed_tables:
        assert p.name in text and f"{p.calc_vparam:,.1f}" in text
    assert "excluded by user" in text and "lookup chains" in text
    assert text.count("\n") == 1 + 1 + len(plan.packed_tables) + 1 + 2 - 1


def test_same_input_same_plan():
    ts = [_spec(f"t{i}", [8, 16, 32][i % 3], ids=1 + (i * 7) % 5) for i in range(30)]
    a = plan_packing(ts, exclude=["t3"], force_groups={"g": ["t4", "t7"]})
    b = plan_packing(list(ts), exclude=("t3",), force_groups={"g": ("t4", "t7")})
    assert a == b and a.to_json() == b.to_json() and str(a) == str(b)


# --- Invalid overrides --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"exclude": ["nope"]}, r"exclude names table 'nope'"),
        ({"force_groups": {"g": ["a", "nope"]}}, r"force_groups\['g'\] names table 'nope'"),
        ({"force_groups": {"g": ["a"], "h": ["b", "a"]}}, r"'a' is in two forced groups, 'g' and 'h'"),
        ({"force_groups": {"g": ["a", "a"]}}, r"force_groups\['g'\] lists table 'a' twice"),
        ({"force_groups": {"g": ["a", "c"]}, "exclude": ["c"]}, r"'c' is both excluded and in force_groups\['g'\]"),
        ({"force_groups": {"g": []}}, r"force_groups\['g'\] is empty"),
        (
            {"force_groups": {"mix": ["a", "b", "d"]}},
            r"force_groups\['mix'\] mixes .*\[dim 8, float32, optimizer_layout 'sgd'\]: a, b; "
            r"\[dim 16, float32, optimizer_layout 'sgd'\]: d",
        ),
        ({"force_groups": {"mix": ["a", "e"]}}, r"force_groups\['mix'\] mixes .*float16.*: e"),
        ({"force_groups": {"mix": ["a", "f"]}}, r"force_groups\['mix'\] mixes .*optimizer_layout 'adam'\]: f"),
        ({"max_shards": 0}, r"max_shards must be an int >= 1"),
    ],
)
def test_invalid_overrides_name_the_table_or_group(kwargs, match):
    ts = [_spec("a"), _spec("b"), _spec("c"), _spec("d", 16), _spec("e", dtype="float16"), _spec("f", opt="adam")]
    with pytest.raises(ValueError, match=match):
        plan_packing(ts, **kwargs)


def test_invalid_inputs_of_the_wrong_kind_or_duplicate_names():
    with pytest.raises(ValueError, match="duplicate table name 'a'"):
        plan_packing([_spec("a"), _spec("b"), _spec("a", 16)])
    with pytest.raises(TypeError, match=r"exclude must be a collection of table names.*use \['a'\]"):
        plan_packing([_spec("a")], exclude="a")
    with pytest.raises(TypeError, match=r"force_groups\['g'\] must be a list of table names"):
        plan_packing([_spec("a")], force_groups={"g": "a"})
    s = {"a": TableStats(1, 5, 5, 5.0, 1)}
    with pytest.raises(ValueError, match=r"no entry for table.*'b'"):
        plan_packing([_spec("a"), _spec("b"), _spec("c")], s, exclude=["c"])
    assert plan_packing([_spec("a"), _spec("b")], s, exclude=["b"]).num_lookup_chains == 2


# --- Warm-up statistics -------------------------------------------------------------------------


def test_collect_stats_on_zipf_batches_matches_numpy():
    users = TableSpec("users", num_rows=50_000, dim=16)
    tags = TableSpec("tags", num_rows=2_000, dim=8, combiner="mean", ids_per_sample=5.0)
    rare = TableSpec("rare", num_rows=10, dim=8)
    batches = []
    for step in range(6):
        batch = {
            "users": zipf_ids(4096, 50_000, alpha=1.1, seed=step).reshape(64, 64),  # 2-D
            "tags": zipf_ids(20_480, 2_000, alpha=1.05, seed=100 + step, dtype=np.int32),  # flat multi-hot values
        }
        if step == 2:
            batch["rare"] = np.array([3, 3, 4], dtype=np.uint16)
        batches.append(batch)
    got = collect_stats(batches, [users, tags, rare, TableSpec("unused", 5, 4)])
    assert list(got) == ["users", "tags", "rare"]  # tables never seen are left out
    for name in ("users", "tags"):
        per_step = [np.unique(b[name]).size for b in batches]
        all_ids = np.concatenate([b[name].ravel() for b in batches])
        s = got[name]
        assert s.steps == 6 and s.ids_total == all_ids.size
        assert s.distinct_per_step == pytest.approx(np.mean(per_step))
        assert s.distinct_total == np.unique(all_ids).size
        assert s.max_id_count == np.bincount(all_ids).max()
        assert s.unique_ratio == pytest.approx(np.mean(per_step) / (all_ids.size / 6))
    assert got["users"].unique_ratio < 0.9  # Zipf: many repeats inside a batch
    r = got["rare"]
    assert (r.steps, r.ids_total, r.distinct_total, r.max_id_count) == (6, 3, 2, 2)
    assert r.ids_per_step == pytest.approx(0.5) and r.distinct_per_step == pytest.approx(2 / 6)


def test_collect_stats_rejects_bad_batches():
    t = TableSpec("t", num_rows=10, dim=4)
    with pytest.raises(ValueError, match=r"batch 1, table 't': id 10 is outside \[0, 10\)"):
        collect_stats([{"t": np.array([1])}, {"t": np.array([3, 10])}], [t])
    with pytest.raises(ValueError, match=r"id -1 is outside"):
        collect_stats([{"t": np.array([-1, 2])}], [t])
    with pytest.raises(TypeError, match="ids must be an integer array"):
        collect_stats([{"t": np.array([1.0])}], [t])
    with pytest.raises(ValueError, match="'label', which is not one of the tables"):
        collect_stats([{"t": np.array([1]), "label": np.array([0])}], [t])
    with pytest.raises(ValueError, match="at least one warm-up batch"):
        collect_stats([], [t])


def test_plan_from_collected_stats_follows_the_skew():
    # Same dims and sizes; warm-up says table "hot" is looked up 8x as often as the others.
    ts = [TableSpec(n, 1000, 8, optimizer_layout=o) for n, o in [("hot", "adam"), ("x", "adam"), ("y", "sgd")]]
    ts.append(TableSpec("z", 1000, 8))
    batches = [
        {"hot": zipf_ids(800, 1000, seed=s), "x": zipf_ids(100, 1000, seed=s), "y": np.arange(100), "z": np.arange(100)}
        for s in range(3)
    ]
    plan = plan_packing(ts, collect_stats(batches, ts))
    # adam group 900 ids/step * 8 vs sgd group 200 * 8: above average, 4.5x the other group -> 2 shards.
    assert [(p.name, p.member_names) for p in plan.packed_tables] == [
        ("packed_8d_float32_adam_shard0", ["hot"]),
        ("packed_8d_float32_adam_shard1", ["x"]),
        ("packed_8d_float32_sgd", ["y", "z"]),
    ]
    assert plan.packed_tables[0].calc_vparam == pytest.approx(8 * 800)


def test_plan_modules_do_not_import_tensorflow():
    for module in (packing, stats, tables):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] == "tensorflow" or m.startswith("hybridtf._src.run")]

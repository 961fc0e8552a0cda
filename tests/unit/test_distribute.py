"""Hybrid-parallel pieces that need no second process: shard layouts, plan placement, traffic estimate."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.distribute.layout import ShardLayout
from hybridtf._src.distribute.traffic import estimate_traffic
from hybridtf._src.plan.packing import PackingPlan, plan_packing
from hybridtf._src.plan.tables import TableSpec


@pytest.mark.parametrize("strategy", ["mod", "range"])
@pytest.mark.parametrize("rows,size", [(10, 3), (7, 2), (1, 4), (0, 2), (101, 7), (5, 1)])
def test_layout_places_every_row_once(strategy, rows, size):
    layout = ShardLayout(rows, size, strategy)
    assert sum(layout.local_rows(k) for k in range(size)) == rows
    owner = np.full(rows, -1)
    for k in range(size):
        for offset, count in [(0, rows), (min(3, rows), max(0, rows - 3)), (min(1, rows), min(2, max(0, rows - 1)))]:
            seg = layout.segment(offset, count, k)
            members = seg.member_start + seg.stride * np.arange(seg.count)
            assert np.all((members >= 0) & (members < max(count, 1)))
            local = seg.local_start + np.arange(seg.count)
            assert np.all(local < layout.local_rows(k) + (seg.count == 0))
            if offset == 0 and count == rows:
                owner[members] = k
    assert np.all(owner >= 0)
    if strategy == "mod":
        assert owner.tolist() == [r % size for r in range(rows)]
    order = layout.gather_order(0, rows)
    assert sorted(order.tolist()) == list(range(rows))


def test_plan_placement_and_json_round_trip():
    plan = plan_packing(
        [TableSpec("big", 1000, 8), TableSpec("small", 10, 4)], replicate_below_rows=100, shard_strategy="range"
    )
    assert PackingPlan.from_json(plan.to_json()) == plan
    placements = {pt.name: plan.placement(pt.name, 2) for pt in plan.packed_tables}
    assert sorted(placements.values()) == ["replicated", "sharded"]
    assert {plan.placement(pt.name, 1) for pt in plan.packed_tables} == {"local"}
    with pytest.raises(ValueError, match="strategy"):
        plan_packing([TableSpec("a", 10, 4)], shard_strategy="hash")
    with pytest.raises(ValueError, match="replicate_below_rows"):
        plan_packing([TableSpec("a", 10, 4)], replicate_below_rows=-1)


def test_traffic_estimate_counts_the_exchange_by_hand():
    a = tf.keras.Input([], dtype=tf.int64, name="a")
    b = tf.keras.Input([], dtype=tf.int64, name="b")
    ea = tf.keras.layers.Embedding(10, 4, name="ea")(a)
    eb = tf.keras.layers.Embedding(10, 4, name="eb")(b)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([ea, eb]))
    model = htf.keras.optimize(tf.keras.Model([a, b], out))
    features = [tf.constant([0, 1, 2, 2], tf.int64), tf.constant([3, 3, 5, 6], tf.int64)]
    t = estimate_traffic(model, features, 2)
    # packed rows: ea [0, 10), eb [10, 20); mod: rank 0 owns even rows.
    # rank 0 asks {0, 1, 13}: sends 2 ids + 2 grad rows to rank 1, serves rank 1's {2, 16}: 2 rows.
    # rank 1 asks {2, 15, 16}: sends 2 ids + 2 grad rows to rank 0, serves rank 0's {1, 13}: 2 rows.
    row = 4 * 4
    assert [r["alltoall_bytes"] for r in t["per_rank"]] == [2 * (8 + row) + 2 * row] * 2
    dense = (8 + 1) * 4
    assert t["dense_gradient_bytes"] == dense
    assert [r["allreduce_bytes"] for r in t["per_rank"]] == [dense + 2 * 8] * 2
    assert t["tables"]["packed_4d_float32_model"]["unique_ids_per_rank"] == [3, 3]
    with pytest.raises(ValueError, match="divisible"):
        estimate_traffic(model, features, 3)
    assert estimate_traffic(model, [f.numpy() for f in features], 2) == t  # NumPy batches too (report's)

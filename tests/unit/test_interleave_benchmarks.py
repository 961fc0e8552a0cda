"""The interleaving benchmarks' arithmetic: interval overlap (trace_overlap) and the cost model's step time."""

from __future__ import annotations

import pytest

from benchmarks import bench_interleave_model as model
from benchmarks import trace_overlap


def test_union_and_intersection_of_intervals():
    assert trace_overlap._union([(5, 6), (0, 2), (1, 3)]) == [[0, 3], [5, 6]]
    ex = trace_overlap._union([(0, 10)])
    comp = trace_overlap._union([(2, 4), (3, 5), (8, 12)])
    assert trace_overlap._length(comp) == 7
    assert trace_overlap._intersection(ex, comp) == 5  # [2, 5) and [8, 10)
    assert trace_overlap._clip([[0, 3], [5, 9]], 2, 6) == [[2, 3], [5, 6]]


COSTS = {
    "chain_s": 0.02,
    "dense_s": 0.05,
    "overhead_s": 0.01,
    "alltoall_bytes_2": 4e6,
    "allreduce_bytes_2": 1e6,
    "collectives": 10,
}


def test_step_time_one_rank_is_serial_compute():
    assert model.step_time(COSTS, 1, None, 0.0, 1, 1) == pytest.approx(0.08)
    # one rank: nothing to exchange, so groups change nothing
    assert model.step_time(COSTS, 1, None, 0.0, 4, 1) == pytest.approx(0.08)


def test_step_time_groups_hide_the_smaller_of_chain_and_exchange():
    bw, lat = 1e9, 0.0
    exchange = 5e6 * 2 * (4 - 1) / 4 / bw  # A + D at 4 ranks
    plain = model.step_time(COSTS, 4, bw, lat, 1, 1)
    assert plain == pytest.approx(0.01 + 0.05 + 0.02 + exchange)
    k = model.step_time(COSTS, 4, bw, lat, 2, 1)
    assert k == pytest.approx(0.01 + 0.05 + max(0.02, exchange) + min(0.02, exchange) / 2)
    assert k < plain


def test_step_time_micro_batches_pipeline_front_and_dense():
    bw, lat = 1e9, 0.0
    front = 0.02 + 5e6 * 2 * (2 - 1) / 2 / bw
    s1, s2 = front / 2, 0.05 / 2
    assert model.step_time(COSTS, 2, bw, lat, 1, 2) == pytest.approx(0.01 + s1 + s2 + max(s1, s2))
    # latency per collective grows with the micro-batches (each runs its own chains)
    slow = model.step_time(COSTS, 128, bw, 1e-3, 1, 4, peer=1e-4)
    assert slow > model.step_time(COSTS, 128, bw, 1e-3, 1, 1, peer=1e-4)

"""Exchange/compute overlap from a TF profiler trace (``*.xplane.pb``), for the interleaving benchmarks.

In the host plane of a profile taken with ``tf.profiler.experimental.start``:

* a step is an event carrying the ``tf_function_call`` stat (the traced
  train function's call, on the Python thread);
* an *exchange* is one Horovod collective, from its
  ``ExecutorState::ProcessAsync::Start`` (the op enqueued on this rank) to the
  matching ``ExecutorState::ProcessAsync::Done`` (the result handed back;
  ``_p`` / ``_c`` stats pair them): negotiation with the other ranks, the
  transfer over Gloo and the copies, i.e. the time the step has a collective
  in flight;
* *compute* is every kernel event (``name:Type``) that is not a Horovod op,
  on any thread.

``overlap_share`` = |exchange ∩ compute| / |exchange| over the steps (unions of
intervals, so parallel kernels or collectives are counted once). Also the
kernel time per op type (the per-op costs the cost model uses).
"""

from __future__ import annotations

import collections
import glob
import os


def _load_space(logdir: str):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {logdir}/plugins/profile")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def _union(intervals):
    merged = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def _length(intervals) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _intersection(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(intervals, lo, hi):
    return [[max(a, lo), min(b, hi)] for a, b in intervals if b > lo and a < hi]


def analyze(logdir: str) -> dict:
    """Steps, exchange and compute time, their overlap and per-op-type kernel time (seconds) in a profile."""
    space = _load_space(logdir)
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    names = {k: v.name for k, v in plane.event_metadata.items()}
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    steps, starts, dones, compute = [], {}, {}, []
    op_seconds: dict[str, float] = collections.defaultdict(float)
    for line in plane.lines:
        base = line.timestamp_ns * 1e-9
        for ev in line.events:
            name = names[ev.metadata_id]
            lo = base + ev.offset_ps * 1e-12
            hi = lo + ev.duration_ps * 1e-12
            stats = {stat_names[s.metadata_id]: s for s in ev.stats}
            if "tf_function_call" in stats:
                steps.append((lo, hi))
            elif name.startswith("ExecutorState::ProcessAsync::"):
                kind = stats.get("kernel_type")
                kind = None if kind is None else (kind.str_value or stat_names.get(kind.ref_value, ""))
                if not kind or not kind.startswith("Horovod"):
                    continue
                if name.endswith("Start") and "_p" in stats:
                    starts[stats["_p"].uint64_value or stats["_p"].int64_value] = lo
                elif name.endswith("Done") and "_c" in stats:
                    dones[stats["_c"].uint64_value or stats["_c"].int64_value] = hi
            elif ":" in name and not name.startswith(("ExecutorState", "Executor")) and "::" not in name:
                op_type = name.split(":", 1)[1]
                if op_type.startswith(("Horovod", " ")) or op_type.endswith(("Dataset", "Iterator")):
                    continue  # collectives; function calls (" __inference_..."); train_on_batch's input ops
                compute.append((lo, hi))
                op_seconds[op_type] += hi - lo
    pairs = [(starts[k], dones[k]) for k in starts if k in dones]
    exchange = _union(pairs)
    compute_u = _union(compute)
    steps.sort()
    ex_total = ov_total = comp_total = wall = 0.0
    for lo, hi in steps:
        ex = _clip(exchange, lo, hi)
        co = _clip(compute_u, lo, hi)
        ex_total += _length(ex)
        comp_total += _length(co)
        ov_total += _intersection(ex, co)
        wall += hi - lo
    n = max(len(steps), 1)
    return {
        "steps": len(steps),
        "step_seconds": wall / n,
        "exchange_seconds": ex_total / n,
        "compute_seconds": comp_total / n,
        "overlapped_seconds": ov_total / n,
        "overlap_share": ov_total / ex_total if ex_total else None,
        "collectives": len(pairs) / n,  # collective ops per step
        "exchange_spans": len(exchange) / n,  # their union's intervals per step
        "op_seconds": {k: v / n for k, v in sorted(op_seconds.items(), key=lambda kv: -kv[1])},
    }

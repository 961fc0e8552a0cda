"""Warm-up measurements for Eq. 2 and Eq. 3, taken by hybridtf from one real training step.

``measure_step`` runs one step (a callable) with

* on a GPU, TensorFlow's allocator statistics reset before it: the step's
  peak device memory above what was live before
  (``tf.config.experimental.get_memory_info``), Eq. 2's ``RInstance`` once
  divided by the batch size;
* a TF profiler trace (host ops): the time of every op, attributed to the
  packed chain whose name scope it carries (forward, gradient and fused
  update ops of packed table ``t`` all carry ``t/`` in their names), the rest
  to the dense part. Eq. 3's ``RParam`` for time is a chain's seconds per
  parameter; the default ``RBound`` is the dense part's time.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
import shutil
import tempfile
import time

import tensorflow as tf

from hybridtf._src.plan.interleaving import ChainCost

# Events that wrap other ops (their time is the ops inside them).
_WRAPPERS = ("PartitionedCall", "StatefulPartitionedCall", "__inference", "__forward", "__backward", "While", "If")


@dataclasses.dataclass
class StepMeasurement:
    """One measured step.

    Attributes:
        peak_bytes: the step's peak memory above what was live before it
            (GPU allocator; on CPU filled in from ``measure_host_memory``).
        seconds: wall time of the step (profiling included).
        op_seconds: op time per packed table (name scope), and ``""`` for the rest.
        vparams: packed table -> parameters (floats) per example or per step.
        per_example: whether ``vparams`` are per example (uniform CalcVParam).
    """

    peak_bytes: float
    seconds: float
    op_seconds: dict
    vparams: dict
    per_example: bool

    @property
    def dense_seconds(self) -> float:
        return self.op_seconds.get("", 0.0)

    def chains(self, batch_size: int) -> list[ChainCost]:
        """Eq. 3's per-chain costs: parameters per step and measured seconds."""
        scale = batch_size if self.per_example else 1
        return [
            ChainCost(name, float(v) * scale, {"seconds": self.op_seconds.get(name, 0.0)})
            for name, v in self.vparams.items()
        ]


def memory_device() -> str:
    return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def device_memory() -> float | None:
    """Total memory of the GPU (when there is one; None on CPU: the default bound then takes RAM)."""
    if memory_device() != "GPU:0":
        return None
    try:
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        return float(details.get("memory_limit") or 0) or None
    except (ValueError, RuntimeError):
        return None


def _op_times(logdir: str, names: list[str]) -> dict:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    times = {n: 0.0 for n in names}
    times[""] = 0.0
    paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        return times
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    keys = [(n, f"{n}/") for n in names]
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU") and not plane.name.startswith("/device:"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            if line.name == "python" or "Steps" in line.name:
                continue
            for event in line.events:
                label = meta[event.metadata_id].name
                if ":" not in label or any(w in label for w in _WRAPPERS):
                    continue
                owner = next((n for n, key in keys if key in label), "")
                times[owner] += event.duration_ps * 1e-12
    return times


def _rss() -> tuple[int, int]:
    """(resident bytes now, peak resident bytes since the last reset) of this process (Linux)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _release_free_heap() -> None:
    """Returns the heap's free memory to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Memory an earlier model or step freed stays in malloc's pools and would be
    reused by the measured step without growing the resident size; trimmed,
    the step's allocations show as resident growth again.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure_host_memory(step, optimizer):
    """Runs ``step()`` (the first training step); returns ``(its result, peak bytes it added)``.

    On CPU, TensorFlow's allocator statistics miss most of a step (oneDNN
    keeps its own buffers and counts only large allocations), and memory freed
    by a step stays in the allocators' pools, so a later step adds nothing to
    the process's resident memory (the heap's free memory is therefore handed
    back to the OS first). The first step is measured from
    the process: the peak resident memory (Linux ``VmHWM``, reset through
    ``/proc/self/clear_refs``) above the resident memory before it, minus the
    optimizer variables the step created (slots persist; they are not per
    example). The first step's tracing is included: Eq. 2 errs on the side of
    smaller micro-batches. Returns 0 bytes where ``/proc`` is not available.
    """
    _release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before, _ = _rss()
    except OSError:
        return step(), 0.0
    slots_before = sum(v.shape.num_elements() * v.dtype.size for v in optimizer.variables)
    result = step()
    _, peak = _rss()
    slots = sum(v.shape.num_elements() * v.dtype.size for v in optimizer.variables) - slots_before
    return result, float(max(peak - before - slots, 0))


def measure_step(step, plan, chains=()):
    """Runs ``step()`` once, measured; returns ``(its result, StepMeasurement)``.

    Args:
        step: a callable running one training step.
        plan: the model's ``PackingPlan`` (its packed tables name the chains).
        chains: more name scopes timed as chains (packed HybridHash stores).
    """
    device = memory_device()
    names = [pt.name for pt in plan.packed_tables] + list(chains)
    if device != "CPU:0":
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["current"]
    logdir = tempfile.mkdtemp(prefix="hybridtf_warmup_")
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
    )
    start = time.perf_counter()
    try:
        tf.profiler.experimental.start(logdir, options=options)
        try:
            result = step()
        finally:
            tf.profiler.experimental.stop()
        seconds = time.perf_counter() - start
        peak = tf.config.experimental.get_memory_info(device)["peak"] - before if device != "CPU:0" else 0.0
        op_seconds = _op_times(logdir, names)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    vparams = {pt.name: pt.calc_vparam for pt in plan.packed_tables}
    per_example = plan.vparam_source != "warmup"
    return result, StepMeasurement(float(max(peak, 0)), seconds, op_seconds, vparams, per_example)

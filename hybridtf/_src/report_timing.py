"""Where a training step's time goes, with and without interleaving: the report's timing section.

``step_timing(model, batch)`` times ``model.train_on_batch`` on one batch:
the median wall time of a few unprofiled steps, then one step under the TF
profiler (``rewrite/warmup.py``'s ``measure_step``, the same measurement the
``"auto"`` warm-up takes) whose op time is split into each packed table's
chain (forward, gradient and fused update ops carry the packed table's name
scope, or the packed HybridHash store's; under D-interleaving every micro-batch's
chain does too) and the rest
(dense layers, loss, optimizer, exchange, and the fused concatenation /
first-layer ops, which carry their layer's name). ``timing_section`` puts two such
timings side by side: the model with its interleaving and the same model
optimized without it (``python -m hybridtf.report --timing STEPS`` builds
that second model from the same builder). Op time is summed over threads, so
it can exceed the wall time on a multi-core machine.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from hybridtf._src.rewrite import warmup


@dataclasses.dataclass
class StepTiming:
    """One model's measured training step.

    Attributes:
        label: what was measured (e.g. ``"with interleaving"``).
        step_seconds: median wall time of the unprofiled steps.
        steps: how many unprofiled steps were timed.
        chain_seconds: op time per packed table's chain in the profiled step.
        rest_seconds: op time of everything else in the profiled step.
        micro_batches: micro-batches per step (1: whole batch).
        groups: K-interleaving groups (1: none).
    """

    label: str
    step_seconds: float
    steps: int
    chain_seconds: dict
    rest_seconds: float
    micro_batches: int = 1
    groups: int = 1

    @property
    def chains_total(self) -> float:
        return float(sum(self.chain_seconds.values()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _interleaving_shape(model) -> tuple[int, int]:
    plan = getattr(model, "hybridtf_interleaving", None)
    groups = plan.num_groups if plan is not None else 1
    micro = plan.micro.num_micro_batches if plan is not None and plan.micro is not None else 1
    return micro, groups


def step_timing(model, batch, *, steps: int = 5, label: str = "") -> StepTiming:
    """Times ``steps`` training steps of the compiled, optimized ``model`` on ``batch`` (see the module docstring).

    Args:
        model: a model returned by ``hybridtf.keras.optimize`` (packed or not) and compiled.
        batch: ``(features, labels)``.
        steps: unprofiled steps to take the median of (after two untimed steps).
        label: the name printed for this timing.

    Raises:
        ValueError: ``steps < 1``, or ``model`` is not an optimized model.

    Example:
        >>> step_timing(model, (x, y), steps=3).step_seconds
        0.0123
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}.")
    plan = getattr(model, "hybridtf_plan", None)  # both optimized model classes, packed or not
    if plan is None:
        raise ValueError(
            f"step_timing needs a model returned by hybridtf.keras.optimize; got "
            f"{type(model).__name__} {getattr(model, 'name', '')!r}."
        )
    stores = [g.name for g in getattr(model, "hybridtf_dynamic_plan", None) or ()]
    x, y = batch
    for _ in range(2):  # tracing and, for "auto" interleaving, the measured warm-up step
        model.train_on_batch(x, y)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        seconds.append(time.perf_counter() - start)
    _, measured = warmup.measure_step(lambda: model.train_on_batch(x, y), plan, chains=stores)
    chains = {k: float(v) for k, v in measured.op_seconds.items() if k}
    micro, groups = _interleaving_shape(model)
    return StepTiming(
        label=label,
        step_seconds=float(statistics.median(seconds)),
        steps=steps,
        chain_seconds=chains,
        rest_seconds=float(measured.dense_seconds),
        micro_batches=micro,
        groups=groups,
    )


@dataclasses.dataclass
class TimingSection:
    """Step timings side by side (with interleaving first)."""

    timings: list

    def to_dict(self) -> dict:
        return {"timings": [t.to_dict() for t in self.timings]}

    def __str__(self) -> str:
        if not self.timings:
            return "step time: not measured"
        width = max(14, *(len(t.label) for t in self.timings)) + 2
        head = "".join(f"{t.label:>{width}}" for t in self.timings)
        title = "where the step's time goes (ms)"
        lines = [f"{title:<40}{head}"]

        def row(name, values):
            lines.append(f"  {name:<38}" + "".join(f"{v * 1e3:>{width},.2f}" for v in values))

        lines.append(
            f"  {'shape (micro-batches x groups)':<38}"
            + "".join(f"{f'{t.micro_batches} x {t.groups}':>{width}}" for t in self.timings)
        )
        row(f"step, wall (median of {self.timings[0].steps})", [t.step_seconds for t in self.timings])
        row("op time: packed chains", [t.chains_total for t in self.timings])
        for name in sorted({n for t in self.timings for n in t.chain_seconds}):
            row(f"  {name}", [t.chain_seconds.get(name, 0.0) for t in self.timings])
        row("op time: dense, loss, optimizer, rest", [t.rest_seconds for t in self.timings])
        return "\n".join(lines)


def timing_section(model, batch, *, without=None, steps: int = 5) -> TimingSection:
    """``model``'s step timing and, when given, ``without``'s (the same model optimized without interleaving)."""
    timings = [step_timing(model, batch, steps=steps, label="as optimized" if without is None else "interleaved")]
    if without is not None:
        timings.append(step_timing(without, batch, steps=steps, label="not interleaved"))
    return TimingSection(timings)

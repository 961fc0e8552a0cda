"""Interleaving for optimized Keras models: micro-batched steps (Eq. 2) and K-interleaving groups (Eq. 3).

``hybridtf.keras.optimize(model, micro_batches=..., interleave_from=...,
interleave_groups=...)`` calls ``attach``, which gives the optimized model one
more run-time subclass (``_InterleaveModelMixin``):

* ``train_step`` runs the micro-batched step (``rewrite/micro_batch.py``)
  when the plan has more than one micro-batch;
* with ``"auto"`` values, the first two training steps run whole and
  un-interleaved (exact: the same math) and are the warm-up
  (``rewrite/warmup.py``): on CPU step 1's peak memory is measured from the
  process (resident memory), step 2 gives each packed chain's op time from a
  TF profiler trace (and, on a GPU, the step's peak device memory). Eq. 2 and Eq. 3 then make the
  ``InterleavingPlan`` and the train function is rebuilt with it;
* ``model.hybridtf_interleaving`` is the plan (None before an ``"auto"``
  warm-up), printable and JSON.
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass
from hybridtf._src.plan.interleaving import (
    ChainCost,
    InterleavingPlan,
    MicroBatching,
    choose_micro_batches,
    default_memory_bound,
    is_count,
    plan_interleaving,
)
from hybridtf._src.rewrite import interleave, micro_batch, warmup
from hybridtf._src.rewrite.micro_batch import MicroBatchError


class _InterleaveModelMixin(PlainConstruction):
    """Per-instance overrides: micro-batched ``train_step`` and the ``"auto"`` warm-up."""

    def train_step(self, data):
        micro = self._htf_micro
        if self._htf_pending is not None:  # warm-up: whole-batch step, remember the batch size
            x, _, _ = tf.keras.utils.unpack_x_y_sample_weight(data)
            self._htf_batch_seen.assign(micro_batch._batch_size(x))
        if micro is None or micro.num_micro_batches <= 1 or self._htf_pending is not None:
            return super().train_step(data)
        return micro_batch.micro_batched_train_step(self, data, micro.num_micro_batches, micro.interleave_from)

    def make_train_function(self, force=False):
        micro = self._htf_micro
        if self._htf_pending is not None or (micro is not None and micro.num_micro_batches > 1):
            micro_batch.check_layers(self)  # a layer unfrozen since optimize (fit calls this before tracing)
            micro_batch.sums_over_batch(self)  # compiled losses mixing reductions: refused before tracing
        if self._htf_pending is None:
            return super().make_train_function(force)
        if self.train_function is not None and not force:
            return self.train_function
        whole = super().make_train_function(force=True)
        host_peak = []

        def warmup_step(iterator):
            if not host_peak:  # step 1: memory from the process on CPU (tracing, slots: not timed)
                result, peak = warmup.measure_host_memory(lambda: whole(iterator), self.optimizer)
                host_peak.append(peak)
                return result
            result, measured = warmup.measure_step(lambda: whole(iterator), self._htf_runtime.plan)
            if warmup.memory_device() == "CPU:0":
                measured.peak_bytes = host_peak[0]
            _finish_plan(self, measured)
            super(_InterleaveModelMixin, self).make_train_function(force=True)
            return result

        self.train_function = warmup_step
        return warmup_step

    def _htf_whole_batch_requests(self, x):
        """The step's lookup requests, ids taken from ``x`` (for micro-batches from the MLP)."""
        from hybridtf._src.integrations import keras_record

        base_call = self._htf_model_call()
        kwargs = {"training": False} if self._expects_training_arg else {}
        requests = keras_record.lookups_from_inputs(self, base_call, x, kwargs)
        if requests is None:  # ids computed inside the model: recorded in training mode, their ops copied
            step_kwargs = {"training": True} if self._expects_training_arg else {}
            requests = keras_record.recorded_in_step_mode(self, base_call, x, step_kwargs)
        if requests is None:
            raise MicroBatchError(
                "interleave_from='mlp' needs every embedding lookup's ids to be model inputs (the lookups run once "
                "on the whole batch, before the model's layers); this model computes ids inside. Use "
                "interleave_from='embedding'."
            )
        return requests

    @property
    def hybridtf_interleaving(self) -> InterleavingPlan | None:
        """The interleaving plan (K-groups, micro-batching); None until an ``"auto"`` warm-up has run."""
        return self._htf_interleaving


class _UnpackedMicroBatchMixin(PlainConstruction):
    """A model ``optimize`` packed no static table of (dynamic stores only, or nothing), micro-batched."""

    def train_step(self, data):
        micro = self._htf_micro
        return micro_batch.micro_batched_train_step(self, data, micro.num_micro_batches, micro.interleave_from)

    def make_train_function(self, force=False):
        micro_batch.check_layers(self)  # a layer unfrozen since optimize (fit calls this before tracing)
        micro_batch.sums_over_batch(self)  # compiled losses mixing reductions: refused before tracing
        return super().make_train_function(force)


def _positive(value) -> bool:
    """A finite number > 0 (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _micro_batch_count(micro_batches):
    """``micro_batches`` checked: ``"auto"``, or a Python int (a NumPy integer too)."""
    if not (micro_batches == "auto" or is_count(micro_batches)):
        raise MicroBatchError(f"micro_batches must be an int >= 1 or 'auto', got {micro_batches!r}.")
    return micro_batches if micro_batches == "auto" else int(micro_batches)


def attach_unpacked(model, packing, *, micro_batches=1, interleave_from: str = "embedding") -> None:
    """Micro-batches for a model with no packed static table: each micro-batch runs the whole forward.

    Its dynamic tables (packed stores or layers' own) fill their step buffers once per micro-batch
    (``caching/fills.py``). ``"auto"`` and the modes that run packed chains once on the whole batch
    need packed static tables and are refused.
    """
    micro_batches = _micro_batch_count(micro_batches)
    if micro_batches == 1:
        return
    if micro_batches == "auto":
        raise MicroBatchError(
            "micro_batches='auto' sizes micro-batches from a warm-up that measures the packed static tables' chains, "
            "and optimize packed no static table of this model (model.hybridtf_skipped says why). Pass a number of "
            "micro-batches."
        )
    if interleave_from != "embedding":
        raise MicroBatchError(
            f"interleave_from={interleave_from!r} runs the packed static tables' lookups once on the whole batch, "
            "and optimize packed no static table of this model: its lookups run in each micro-batch's forward. Use "
            "interleave_from='embedding'."
        )
    micro_batch.check_model(model, micro_batches, interleave_from)
    micro = MicroBatching(micro_batches, interleave_from)
    model.__class__ = runtime_subclass(_UnpackedMicroBatchMixin, type(model))
    object.__setattr__(model, "_htf_micro", micro)
    object.__setattr__(model, "_htf_interleaving", interleave.static_plan(packing, None, micro=micro))


def _same_on_every_rank(model, measured: warmup.StepMeasurement, batch: int) -> int:
    """Rank 0's measurements for every rank of a Horovod job: every rank must build the same plan."""
    world = model._htf_runtime.storage.world
    if not world.distributed:
        return batch
    names = sorted(measured.op_seconds)
    values = [measured.peak_bytes, float(batch)] + [measured.op_seconds[n] for n in names]
    shared = world.hvd.broadcast(tf.constant(values, tf.float64), root_rank=0, name="hybridtf_warmup").numpy()
    measured.peak_bytes = float(shared[0])
    measured.op_seconds = {n: float(v) for n, v in zip(names, shared[2:])}
    return int(shared[1])


def _finish_plan(model, measured: warmup.StepMeasurement) -> None:
    pending = model._htf_pending
    batch = _same_on_every_rank(model, measured, int(model._htf_batch_seen.numpy()))
    micro = model._htf_micro
    if pending["micro"] == "auto":
        bound = pending["memory_bound"] or default_memory_bound(device_bytes=warmup.device_memory())
        micro = choose_micro_batches(measured.peak_bytes, max(batch, 1), bound, pending["interleave_from"])
    plan = _group_plan(model, pending, measured.chains(batch), measured.dense_seconds)
    model._htf_runtime.interleaving = plan if plan.num_groups > 1 else None
    object.__setattr__(model, "_htf_interleaving", plan.with_micro(micro))
    object.__setattr__(model, "_htf_micro", micro)
    object.__setattr__(model, "_htf_pending", None)


def _group_plan(model, pending, chains: list[ChainCost], dense_seconds: float) -> InterleavingPlan:
    groups = pending["groups"]
    bounds = dict(pending["bounds"] or {"seconds": dense_seconds})
    return plan_interleaving(
        chains,
        bounds=bounds,
        scale=pending["scale"],
        num_groups=groups if isinstance(groups, int) else None,
        exclude=pending["exclude"],
    )


def attach(
    model,
    *,
    micro_batches=1,
    interleave_from: str = "embedding",
    micro_batch_memory: float | None = None,
    interleave_groups=None,
    interleave_scale: float = 1.0,
    interleave_exclude=(),
    interleave_bounds=None,
) -> None:
    """Sets up interleaving on an optimized model (see ``hybridtf.keras.optimize``)."""
    if isinstance(interleave_groups, InterleavingPlan):
        plan, groups = interleave_groups, None
    else:
        plan, groups = None, interleave_groups
    micro_batches = _micro_batch_count(micro_batches)
    groups = groups if groups is None or groups == "auto" or not is_count(groups) else int(groups)
    if not (groups is None or groups == "auto" or is_count(groups)):
        raise MicroBatchError(
            f"interleave_groups must be None, an int >= 1, 'auto' or an InterleavingPlan, got {groups!r}."
        )
    for name, value in (("micro_batch_memory", micro_batch_memory), ("interleave_scale", interleave_scale)):
        if value is not None and not _positive(value):
            raise MicroBatchError(
                f"{name} must be a positive number{' of bytes, or None for the default' if name[0] == 'm' else ''}, "
                f"got {value!r}."
            )
    micro_batch.check_model(model, 2 if micro_batches == "auto" else micro_batches, interleave_from)
    interleave_exclude = interleave.packed_names(model._htf_runtime.plan, interleave_exclude)
    micro = None if micro_batches == "auto" else MicroBatching(micro_batches, interleave_from)
    model.__class__ = runtime_subclass(_InterleaveModelMixin, type(model))
    table_ids = {id(v) for v in model._htf_runtime.storage.packed.values()}
    object.__setattr__(model, "_htf_table_variable_ids", table_ids)
    object.__setattr__(model, "_htf_micro", micro)
    pending = None
    if micro_batches == "auto" or groups == "auto":
        pending = {
            "micro": micro_batches,
            "interleave_from": interleave_from,
            "memory_bound": micro_batch_memory,
            "groups": groups if groups != "auto" else None,
            "scale": interleave_scale,
            "exclude": tuple(interleave_exclude),
            "bounds": interleave_bounds,
        }
        if groups is None and micro_batches == "auto":
            pending["groups"] = 1
        with tf.init_scope():
            object.__setattr__(model, "_htf_batch_seen", tf.Variable(0, dtype=tf.int32, trainable=False))
        plan = None
    else:
        plan = interleave.static_plan(
            model._htf_runtime.plan, plan or groups, interleave_exclude, bounds=interleave_bounds, micro=micro
        )
        if plan.micro is None:
            plan = plan.with_micro(micro)
        object.__setattr__(model, "_htf_micro", plan.micro)
    object.__setattr__(model, "_htf_pending", pending)
    object.__setattr__(model, "_htf_interleaving", plan)
    if plan is not None:
        model._htf_runtime.interleaving = plan if plan.num_groups > 1 else None

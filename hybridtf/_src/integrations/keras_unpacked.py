"""The model ``optimize`` returns when it packs none of the model's static tables.

It runs as plain Keras (its packed DynamicEmbedding stores, if any, have their
own model mixin, ``rewrite/packed_dynamic.py``) and keeps the promises of an
optimized model's class (``keras_model.py``): ``hybridtf_plan`` /
``hybridtf_skipped`` / the fusion lists, ``compile`` hooking the optimizer for
its dynamic tables, Keras files loading the optimizer state, saves under
Horovod with tables sharded by id, and crash-safe saves
(``atomic_checkpoint.crash_safe_path``: a kill during ``save_weights`` or a
``.keras`` save leaves the newest complete save readable, as ``ModelCheckpoint``'s).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import tensorflow as tf

from hybridtf._src.caching.optimizer import hook_for_model as hook_dynamic_optimizer
from hybridtf._src.capture.keras_capture import SkippedLayer
from hybridtf._src.capture.subclassing import PlainConstruction
from hybridtf._src.distribute import agreement, dynamic_exchange, watchdog
from hybridtf._src.distribute.world import current_world
from hybridtf._src.integrations import atomic_checkpoint, keras_end_of_data, keras_notices, keras_slots
from hybridtf._src.integrations.keras_best_weights import keep_best_tables
from hybridtf._src.integrations.keras_optimizers import user_class
from hybridtf._src.once import first_time
from hybridtf._src.plan.packing import PackingPlan

_log = logging.getLogger("hybridtf")


def sharded_save_error(size: int) -> NotImplementedError:
    return NotImplementedError(
        f"model.save of a model whose tables are sharded over {size} Horovod ranks: its traced functions "
        "exchange rows between ranks. Call model.save_weights(path) on every rank, then load the weights into "
        "the model in one process (hybridtf.keras.optimize without Horovod, or the plain model) and save or "
        "export that."
    )


def sharded_size(model) -> int | None:
    """The number of Horovod ranks ``model``'s tables (static or dynamic) are sharded over; None if not sharded."""
    storage = getattr(getattr(model, "_htf_runtime", None), "storage", None)
    if storage is not None and storage.sharded:
        return storage.world.size
    dynamic = dynamic_exchange.sharded_tables(model)
    return dynamic[0].world.size if dynamic else None


def rank_local_variables(model) -> list:
    """``model``'s variables each rank holds its own values of under Horovod: its static tables' shards with
    their optimizer slots, and its sharded dynamic tables' distinct-rows buffers."""
    storage = getattr(getattr(model, "_htf_runtime", None), "storage", None)
    local = list(storage.local_variables()) if storage is not None else []
    return local + dynamic_exchange.sharded_dynamic_buffers(model)


def writes_here(model, world, filepath, call: str) -> bool:
    """Whether this rank writes a save of ``model`` whose tables are not sharded over the ranks of ``world``.

    Every rank holds the same values then, so under Horovod rank 0 writes, as it does for sharded models, and
    the other ranks' calls write nothing (said once per model). Before, every rank wrote: a ``ModelCheckpoint``
    on every rank (needed for sharded models) had two ranks' crash-safe saves of one path remove each other's
    temporaries, and rank 0's save failed (found by a probe).
    """
    if not world.distributed or world.rank == 0:
        return True
    if first_time(model, "_htf_rank_save_told"):
        _log.warning(
            "hybridtf: under Horovod rank 0 writes the saves of model %r (every rank holds the same values); rank %d's "
            "%s(%r) writes nothing. Load rank 0's path on every rank (on hosts without a shared file system, copy "
            "rank 0's files there first).",
            model.name,
            world.rank,
            call,
            os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else filepath,
        )
    return False


def check_same_path(model, world, filepath) -> None:
    """Before a gathering save of a sharded model: every rank gives the same path, which rank 0 writes.

    A per-rank path (``ModelCheckpoint(f"ckpt/rank{rank}/w")``) left the other ranks' directories empty,
    silently (found by a probe). One allgather of the path's digest.
    """
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else repr(filepath)
    agreement.check_same_settings(
        world,
        {"the path": path},
        f"save_weights of model {model.name!r}",
        fix="The model's tables are sharded over the ranks: every rank gives its shards and rank 0 writes one "
        "checkpoint, which any number of ranks restores. Give every rank the same path (no rank in it).",
        phase=watchdog.CHECKPOINT_GATHER,  # the first collective of the save, as a diverged rank's error names it
    )


def refuse_sharded_model_saves(model, callbacks) -> None:
    """A ``ModelCheckpoint`` that saves the whole model (``save_weights_only=False``) of a model with tables
    sharded over Horovod ranks: refused when ``fit`` starts (``model.save`` refuses it), not at its first save."""
    for callback in callbacks or ():
        if isinstance(callback, tf.keras.callbacks.ModelCheckpoint) and not callback.save_weights_only:
            size = sharded_size(model)
            if size:
                error = sharded_save_error(size)
                raise NotImplementedError(f"{error} (ModelCheckpoint: pass save_weights_only=True.)")


def check_ranks_save_alike(model, callbacks) -> None:
    """Under Horovod, with tables sharded over the ranks: every rank's ``fit`` has the same saving callbacks.

    Each save of a sharded model is a collective (the shards are gathered), so a ``ModelCheckpoint`` on
    rank 0 only — Horovod's idiom for dense models — would leave rank 0 in the gather while the others
    train on, until the collective timeout. One allgather when ``fit`` starts names it instead.
    """
    if not sharded_size(model):
        return
    world = current_world()
    saving = [
        f"{type(c).__name__}(save_freq={getattr(c, 'save_freq', None)!r}"
        + (f", save_best_only=True, monitor={c.monitor!r})" if getattr(c, "save_best_only", False) else ")")
        for c in callbacks or ()
        if isinstance(c, (tf.keras.callbacks.ModelCheckpoint, tf.keras.callbacks.BackupAndRestore))
    ]
    agreement.check_same_settings(
        world,
        {"the checkpoint callbacks": saving},
        f"fit of model {model.name!r}",
        fix="Its tables are sharded over the ranks and every save gathers them from all ranks: give fit the same "
        "ModelCheckpoint (save_weights_only=True) / BackupAndRestore callbacks on every rank, not on rank 0 only "
        "(rank 0 writes the file; BackupAndRestore needs one backup_dir per rank).",
    )


def average_best_batch_metric(model, callbacks) -> None:
    """Under Horovod, with tables sharded over the ranks: a ``ModelCheckpoint(save_best_only=True)`` that saves
    every N batches decides on its monitored value averaged over the ranks.

    Its batch-end logs hold each rank's own metrics (``hvd.callbacks.MetricAverageCallback`` averages at epoch
    ends only), so the ranks decided differently: one saved (a collective gather of the shards) while another
    trained on, until the collective timeout, whose advice (``MetricAverageCallback``) the user had followed
    (found by a probe). The callback now sees, at each batch's end, the ranks' mean of the monitored value (one
    allreduce of a scalar; the other callbacks see the rank's own logs): with equal batches per rank, the value
    one process computes on the whole batch. ``check_ranks_save_alike`` has compared the ranks' callbacks first.
    """
    if not sharded_size(model):
        return
    world = current_world()
    for callback in callbacks or ():
        if (
            isinstance(callback, tf.keras.callbacks.ModelCheckpoint)
            and callback.save_best_only
            and callback.save_freq != "epoch"
            and not getattr(callback, "_htf_ranks_mean", False)
        ):
            _decide_on_ranks_mean(callback, world)


def _decide_on_ranks_mean(callback, world) -> None:
    own = callback.on_train_batch_end
    monitor = callback.monitor

    def on_train_batch_end(batch, logs=None):
        if logs and monitor in logs:  # the same keys on every rank (the same compiled metrics)
            local = tf.constant(float(np.asarray(logs[monitor])), tf.float64)
            with watchdog.collective_phase(world, watchdog.CHECKPOINT_GATHER, f"ModelCheckpoint's {monitor!r}"):
                mean = world.hvd.allreduce(local, op=world.hvd.Average, name="hybridtf_best_checkpoint_metric")
            logs = {**logs, monitor: float(mean)}
        return own(batch, logs)

    callback.on_train_batch_end = on_train_batch_end
    callback._htf_ranks_mean = True


def fusions_traced(model, kind: str) -> list[str]:
    """``model``'s fusions of one kind (a ``FusionLog`` field) as its forward pass was last traced; [] before."""
    log = getattr(model, "_htf_fusion_log", None)
    return list(getattr(log, kind)) if log is not None else []


class FusionListsMixin:
    """The model's fusions as its forward pass was last traced (``_htf_fusion_log``), and its packed
    HybridHash stores. Without static packed tables only packed DynamicEmbedding stores' lookups can be
    fused (their StitchCombine outputs: ``packed_dynamic._DynamicModelMixin``); else the lists are empty."""

    @property
    def hybridtf_dynamic_plan(self) -> list:
        """The packed HybridHash stores (``DynamicGroupPlan``, one per group of DynamicEmbedding layers; empty
        when ``optimize`` packed none: ``hybridtf_skipped`` says why)."""
        packing = getattr(self, "_htf_dynamic", None)
        return packing.plan if packing is not None else []

    @property
    def hybridtf_interleaving(self):
        """The interleaving plan (``InterleavingPlan``); None where there is none (nothing packed and no
        micro-batches) or before an ``"auto"`` warm-up has run."""
        return getattr(self, "_htf_interleaving", None)

    @property
    def hybridtf_fused_concats(self) -> list[str]:
        """Where concatenations and sums of packed lookups became one StitchConcat, as last traced.

        Named by the innermost layer whose call created the op (the op's name for
        the model's own ``call``); empty until a step or prediction is traced.
        """
        return fusions_traced(self, "concats")

    @property
    def hybridtf_fused_dense(self) -> list[str]:
        """Where a matrix product of a fused concatenation became one StitchConcatMatMul, as last traced."""
        return fusions_traced(self, "dense")

    @property
    def hybridtf_fused_fm(self) -> list[str]:
        """Where a factorization machine's cross term over packed fields became one StitchFM, as last traced."""
        return fusions_traced(self, "fm")

    @property
    def hybridtf_fused_dice(self) -> list[str]:
        """Where a Dice activation with train-mode batch norm became one Dice op, as last traced (``dice_fusion``)."""
        return fusions_traced(self, "dice")


class UnpackedModelMixin(keras_end_of_data.EndOfDataMixin, FusionListsMixin, PlainConstruction):
    """Per-instance attributes of a model ``optimize`` could not pack anything of (it runs as plain Keras)."""

    def compile(self, *args, **kwargs):
        keras_notices.refuse_distribution_strategy(self, "compiled")
        keras_notices.refuse_frozen_packed_layers(self)
        super().compile(*args, **kwargs)
        hook_dynamic_optimizer(self, self.optimizer)  # its DynamicEmbedding tables (packed stores included)

    def fit(self, *args, **kwargs):
        refuse_sharded_model_saves(self, kwargs.get("callbacks"))
        check_ranks_save_alike(self, kwargs.get("callbacks"))
        average_best_batch_metric(self, kwargs.get("callbacks"))
        for callback in kwargs.get("callbacks") or ():
            keep_best_tables(callback, self)  # EarlyStopping(restore_best_weights=True): the dynamic tables too
        with_epoch_agreement(self, kwargs)
        return super().fit(*args, **kwargs)

    def save(self, filepath, overwrite=True, save_format=None, **kwargs):
        size = sharded_size(self)
        if size:
            raise sharded_save_error(size)
        if not writes_here(self, current_world(), filepath, "save"):
            return None
        if isinstance(filepath, (str, os.PathLike)) and os.fspath(filepath).endswith(".keras"):
            with atomic_checkpoint.crash_safe_path(filepath, overwrite) as path:
                return super().save(path, overwrite=overwrite, save_format=save_format, **kwargs)
        return super().save(filepath, overwrite=overwrite, save_format=save_format, **kwargs)

    def save_weights(self, filepath, overwrite=True, save_format=None, options=None):
        """Crash-safe; with DynamicEmbedding tables sharded by id over Horovod ranks every rank calls it, rank 0
        writes. Under Horovod without them rank 0 writes too, and the other ranks' calls write nothing
        (``writes_here``)."""

        def write():
            with atomic_checkpoint.crash_safe_path(filepath, overwrite) as path:
                super(UnpackedModelMixin, self).save_weights(
                    path, overwrite=overwrite, save_format=save_format, options=options
                )

        dynamic = dynamic_exchange.sharded_tables(self)
        if not dynamic:
            return write() if writes_here(self, current_world(), filepath, "save_weights") else None
        world = dynamic[0].world
        check_same_path(self, world, filepath)
        with dynamic_exchange.gathered_exports(dynamic):  # every rank gathers the whole tables
            if world.rank == 0:
                write()
        # A barrier: the file is complete before any rank goes on (and maybe reads it).
        world.hvd.allreduce(tf.constant(0), op=world.hvd.Sum, name="hybridtf_saved_weights")
        return None

    def load_weights(self, filepath, *args, **kwargs):
        if str(filepath).endswith((".keras", ".weights.h5")):
            # its dynamic stores' optimizer state too, as an optimized model's
            keras_slots.build_optimizer(self, user_class=user_class)
            atomic_checkpoint.clean_file(filepath, reading=True)  # temporaries of killed saves
        elif isinstance(filepath, (str, os.PathLike)) and not os.path.isdir(filepath):
            filepath = atomic_checkpoint.resolve(os.fspath(filepath))  # the newest complete checkpoint
        with atomic_checkpoint.naming_damage(filepath):
            result = super().load_weights(filepath, *args, **kwargs)
        tables = dynamic_exchange.sharded_tables(self)
        if tables:  # every rank restored the same checkpoint
            agreement.check_model_restored(self, tables[0].world, rank_local_variables(self))
        return result

    @property
    def hybridtf_plan(self) -> PackingPlan:
        """The packing plan (no packed tables)."""
        return self._htf_plan

    @property
    def hybridtf_skipped(self) -> list[SkippedLayer]:
        """Embedding layers left unpacked, with the reason."""
        return list(self._htf_skipped)

    @property
    def hybridtf_shared_uniques(self) -> dict[str, str]:
        """Nothing is packed, so no table shares unique ids."""
        return {}


def with_epoch_agreement(model, kwargs: dict) -> None:
    """Under Horovod with rank-local tables, adds ``_EpochAgreement`` to ``fit``'s callbacks (``kwargs``)."""
    world = current_world()
    callbacks = kwargs.get("callbacks")
    if not world.distributed or not rank_local_variables(model) or not isinstance(callbacks, (list, tuple, type(None))):
        return
    kwargs["callbacks"] = [*(callbacks or ()), _EpochAgreement(world)]


_EPOCH_FIX = (
    "Give every rank the same number of batches per epoch: steps_per_epoch=, drop_remainder=True, an even split "
    "of the files, or dataset.repeat() with steps_per_epoch."
)


class _EpochAgreement(tf.keras.callbacks.Callback):
    """Each epoch's end but the last: the ranks compare their epoch's batch counts in one allgather, armed.

    A rank whose epoch ended first waits in it while another is still in a training step: the
    watchdog's diagnosis then names both (``rank 0: training step #5, rank 1: end of epoch 1``)
    instead of the ranks going on to exchange rows with each other's next epoch's steps. The last
    epoch's end is left to what follows ``fit`` (a save, ``evaluate``, the end of the job), as
    with one epoch.
    """

    def __init__(self, world):
        super().__init__()
        self._world = world
        self._start = 0

    def _steps(self) -> int:
        counter = getattr(self.model, "_train_counter", None)
        return int(counter.numpy()) if counter is not None else 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._steps()

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.params.get("epochs", epoch + 1) or self.model.stop_training:
            return
        steps = self._steps() - self._start
        detail = f"model {self.model.name!r}: end of epoch {epoch + 1}"
        with watchdog.collective_phase(self._world, watchdog.EPOCH_END, detail, epoch + 1):
            local = np.array([steps], np.int64)
            counts = np.asarray(self._world.hvd.allgather(local, name="hybridtf_epoch_batches")).ravel()
        if len(set(counts.tolist())) > 1:
            raise ValueError(
                f"Horovod ranks ran different numbers of batches in epoch {epoch + 1} of model {self.model.name!r} "
                f"(per rank: {counts.tolist()}); their tables' exchanges paired each other's steps. {_EPOCH_FIX}"
            )

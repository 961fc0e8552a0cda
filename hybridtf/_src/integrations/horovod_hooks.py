"""What hybridtf adds to Horovod's own Keras and custom-loop tools for sharded tables.

A shard (this rank's rows of a packed table) and its optimizer slots are
local to the rank: broadcasting them from rank 0, or allreducing their
gradients, would be wrong. Horovod has the notion ("local variables"); these
helpers register hybridtf's shards with it.

``guard_collectives`` makes every Keras training, evaluation and prediction
call of a distributed model an armed collective phase of the watchdog
(``hybridtf._src.distribute.watchdog``): ranks that diverge end with an error
instead of waiting forever.
"""

from __future__ import annotations

from hybridtf._src.capture.subclassing import PlainConstruction, runtime_subclass
from hybridtf._src.distribute import agreement, watchdog
from hybridtf._src.distribute.world import current_world

# Graph collection of the shards created in a TF1 graph (Estimator): rank-local variables.
LOCAL_VARIABLES = "hybridtf_local_variables"


def sharded_world(graph):
    """The Horovod job when ``graph`` (a TF1 graph) holds tables sharded over its ranks (``LOCAL_VARIABLES``),
    else None: their checkpoints gather the shards, a collective every rank must enter."""
    world = current_world()
    return world if world.distributed and graph.get_collection(LOCAL_VARIABLES) else None


def graph_local_variables(graph=None) -> list:
    """The shards of ``graph`` (default graph) and their optimizer slots (``<shard>/...`` of the same shape)."""
    import tensorflow as tf

    graph = graph or tf.compat.v1.get_default_graph()
    shards = graph.get_collection(LOCAL_VARIABLES)
    out = list(shards)
    names = {v.op.name: v for v in shards}
    for var in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        owner = next((n for n in names if var.op.name.startswith(n + "/")), None)
        if owner is not None and var.shape == names[owner].shape:
            out.append(var)
    return out


class _ShardAwareBroadcastMixin:
    """Per-instance override of Horovod's BroadcastGlobalVariablesCallback: skips shards and their slots."""

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        import horovod.tensorflow as hvd

        local = {v.ref() for v in self._htf_storage.local_variables()}
        replicated = [v for v in agreement.variables_only(self.model.variables) if v.ref() not in local]
        hvd.broadcast_variables(replicated, root_rank=self.root_rank)
        optimizer_vars = self.model.optimizer.variables
        optimizer_vars = optimizer_vars() if callable(optimizer_vars) else optimizer_vars
        hvd.broadcast_variables([v for v in optimizer_vars if v.ref() not in local], root_rank=self.root_rank)
        self.broadcast_done = True


def shard_aware_callback(callback, storage, model) -> None:
    """Makes a ``hvd.callbacks.BroadcastGlobalVariablesCallback`` leave ``storage``'s shards alone (in place)."""
    try:
        from horovod._keras.callbacks import BroadcastGlobalVariablesCallbackImpl
    except ImportError:
        return
    if isinstance(callback, BroadcastGlobalVariablesCallbackImpl) and not isinstance(
        callback, _ShardAwareBroadcastMixin
    ):
        callback.__class__ = runtime_subclass(_ShardAwareBroadcastMixin, type(callback))
        callback._htf_storage = storage


def _guard(model, function, phase: str, kind: str):
    if function is None or getattr(function, "_htf_guarded", False):
        return function
    storage = getattr(getattr(model, "_htf_runtime", None), "storage", None)
    world = storage.world if storage is not None else current_world()  # an unpacked model: sharded dynamic tables
    counter = f"{id(model)}.{kind}"
    detail = f"model {model.name!r}"

    def guarded(*args, **kwargs):
        seq = watchdog.next_seq(counter)
        with watchdog.collective_phase(world, phase, detail, seq, first=seq == 1):
            return function(*args, **kwargs)

    guarded._htf_guarded = True
    return guarded


class _CollectiveGuardMixin(PlainConstruction):
    """Per-instance override of a distributed model: Keras step functions run as armed collective phases.

    Tracing a step (``*_step`` runs only then) does not count against the timeout.
    """

    def make_train_function(self, force=False):
        return _guard(self, super().make_train_function(force), watchdog.TRAINING_STEP, "train")

    def make_test_function(self, force=False):
        return _guard(self, super().make_test_function(force), watchdog.EVALUATION_STEP, "test")

    def make_predict_function(self, force=False):
        return _guard(self, super().make_predict_function(force), watchdog.PREDICTION_STEP, "predict")

    def train_step(self, data):
        with watchdog.paused_for_tracing():
            return super().train_step(data)

    def test_step(self, data):
        with watchdog.paused_for_tracing():
            return super().test_step(data)

    def predict_step(self, data):
        with watchdog.paused_for_tracing():
            return super().predict_step(data)


def guard_collectives(model) -> None:
    """Arms the collective watchdog around ``model``'s Keras step functions (in place; distributed models)."""
    if not isinstance(model, _CollectiveGuardMixin):
        model.__class__ = runtime_subclass(_CollectiveGuardMixin, type(model))

"""The Horovod checks of a wrapped model_fn's training graph (its gradients' averaging over the ranks).

A shard's rows are this rank's own, so Horovod must not average its gradient
(refused); the dense variables' gradients must be averaged, or the ranks train
apart (warned); checkpoints, which gather the shards, must be saved by steps
(a schedule in seconds is refused); and every rank must restore the same
checkpoint into its rank-local tables (compared when the model_fn is built).
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError
from hybridtf._src.integrations.estimator_updates import _HOROVOD_SCOPE, _log, _reaches, _table_updates

_HOROVOD_AVERAGING = ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather")


def _averages(op) -> bool:
    return op.type.startswith(_HOROVOD_AVERAGING) or bool(_HOROVOD_SCOPE.search(op.name))


def check_shards_stay_local(packed: dict, sharded: set) -> None:
    """Raises when Horovod allreduces the gradient of a packed table sharded over the ranks.

    ``hvd.DistributedOptimizer`` averages every gradient; a shard's rows are
    this rank's own (its gradient rows came through the alltoall), so
    averaging them with other ranks' shards mixes different tables' rows.
    ``htf.horovod.DistributedOptimizer`` registers the shards as local.

    Args:
        packed: packed table name -> its variable (this rank's shard when sharded).
        sharded: names of the packed tables sharded over the ranks.
    """
    for name in sorted(sharded):
        for update in _table_updates(packed[name]):
            found = _reaches(update, _averages)
            if found is not None:
                raise CaptureError(
                    f"hybridtf.estimator: Horovod's {found.name!r} ({found.type}) averages the gradient of packed "
                    f"table {name!r}, which is sharded over the ranks: each rank holds other rows of it, so the "
                    "average would mix rows of different tables. Wrap the optimizer with "
                    "htf.horovod.DistributedOptimizer instead of hvd.DistributedOptimizer (it keeps the shards "
                    "local and scales their gradients by 1 / size)."
                )


def check_save_schedule(graph: tf.Graph, config, mode) -> None:
    """Refuses a time-based checkpoint schedule when the TRAIN graph has tables sharded over Horovod ranks.

    Every save gathers the shards, a collective that every rank must enter at
    the same step. ``save_checkpoints_secs`` (``tf.estimator.RunConfig``'s
    default: 600 s) saves when each rank's own clock says so, at different
    steps: the ranks would wait for each other forever.
    """
    from hybridtf._src.integrations.horovod_hooks import sharded_world

    secs = getattr(config, "save_checkpoints_secs", None)
    world = sharded_world(graph) if mode == tf.estimator.ModeKeys.TRAIN and secs is not None else None
    if world is None:
        return
    raise ValueError(
        f"hybridtf.estimator: RunConfig(save_checkpoints_secs={secs}) on {world.size} Horovod ranks. Every "
        "checkpoint gathers the tables sharded over the ranks, a collective all ranks must enter at the same step; "
        "a schedule in seconds saves at a different step on each rank, and the ranks would wait for each other "
        "forever. Save by steps: tf.estimator.RunConfig(save_checkpoints_steps=N) (tf.estimator.RunConfig() "
        "saves every 600 s by default)."
    )


def warn_unaveraged_dense(packed: dict, world) -> None:
    """Logs when, on several ranks, no dense variable's update goes through a Horovod allreduce.

    The ranks then train apart (each on its own data, each writing another
    checkpoint), silently: the model_fn's optimizer is not wrapped with
    ``htf.horovod.DistributedOptimizer``.
    """
    if not world.distributed:
        return
    shards = {v.op.name for v in packed.values()}
    dense = [v for v in tf.compat.v1.trainable_variables() if v.op.name not in shards and hasattr(v, "handle")]
    updated = [(v, ops) for v in dense if (ops := _table_updates(v))]
    if updated and not any(_reaches(op, _averages) for _, ops in updated for op in ops):
        _log.warning(
            "hybridtf.estimator: this job runs on %d Horovod ranks, but no update of the model_fn's dense variables "
            "(e.g. %r) averages its gradient over the ranks: each rank trains its own dense layers on its own data. "
            "Wrap the optimizer with htf.horovod.DistributedOptimizer.",
            world.size,
            updated[0][0].op.name,
        )


def check_same_start(graph: tf.Graph, config, mode) -> None:
    """Refuses Horovod ranks that would restore different checkpoints into rank-local tables.

    A rank keeps its own rows of the tables sharded over the ranks (static shards, dynamic tables), which
    Horovod's broadcast of rank 0's variables leaves alone: a rank whose model_dir holds another checkpoint,
    or none, would train another model's rows, and its saves and steps would stop matching the others'
    collectives. Each rank reads the step and the variables (names and shapes) of the checkpoint its
    Estimator will restore; one allgather compares them before the session starts.
    """
    from hybridtf._src.distribute import agreement, watchdog
    from hybridtf._src.distribute.world import current_world
    from hybridtf._src.integrations.estimator_dynamic import dynamic_owners
    from hybridtf._src.integrations.horovod_hooks import sharded_world

    world = current_world()
    if mode == tf.estimator.ModeKeys.PREDICT or not world.distributed:
        return
    if sharded_world(graph) is None and not any(o.table.world.distributed for o in dynamic_owners(graph)):
        return
    model_dir = getattr(config, "model_dir", None)
    path = tf.train.latest_checkpoint(model_dir) if model_dir else None
    step, layout = -1, 0
    if path is not None:
        names = tf.train.list_variables(path)
        layout = agreement.digest(sorted((n, tuple(s)) for n, s in names))
        if any(n == "global_step" for n, _ in names):
            step = int(tf.train.load_variable(path, "global_step"))
    # one allgather in a graph and session of its own, while the model_fn's graph is being built
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        gathered = world.hvd.allgather(tf.constant([[step, layout]], tf.int64), name="hybridtf_estimator_restore")
        with watchdog.collective_phase(world, watchdog.INITIAL_BROADCAST, "Estimator: the checkpoints to restore"):
            values = session.run(gathered)
    if (values == values[0]).all():
        return
    starts = "; ".join(
        f"rank {r}: " + (f"step {int(values[r, 0])}" if values[r, 0] >= 0 else "no checkpoint")
        for r in range(values.shape[0])
    )
    raise ValueError(
        f"hybridtf.estimator: the Horovod ranks would restore different checkpoints ({starts}; this rank, "
        f"{world.rank}, reads {path or 'none'} from model_dir {model_dir!r}). Each rank keeps its own rows of the "
        "tables sharded over the ranks, which no broadcast replaces: every rank must restore the same checkpoint. "
        "Copy the same checkpoint into each rank's model_dir (or give every rank an empty one to start fresh)."
    )

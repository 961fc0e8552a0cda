"""hybridtf under Horovod: hybrid parallel training (model-parallel tables, data-parallel dense layers).

Nothing to call for Keras ``fit``: ``hvd.init()`` before ``hybridtf.keras.optimize``
and each packed table is sharded over the ranks (``model.hybridtf_plan``
decides how), dense gradients are averaged with allreduce, and a
``hvd.DistributedOptimizer`` or ``hvd.callbacks.BroadcastGlobalVariablesCallback``
the script already uses keeps working (the shards are registered as local).

For custom training loops with ``hvd.DistributedGradientTape``, use
``DistributedGradientTape`` below (or register ``local_variables`` yourself);
for gradients from ``hybridtf.micro_batch_gradients``, ``average_gradients``.

Ranks that diverge (uneven batch counts, a ``save_weights`` / ``evaluate`` /
``predict`` one rank reaches and another does not) never wait forever: after
``collective_timeout()`` seconds every rank ends with
``hybridtf.errors.CollectiveTimeoutError`` / ``CollectiveAbortedError``
saying which collective each rank was in (``set_collective_timeout``,
``HYBRIDTF_COLLECTIVE_TIMEOUT_S``; ``collective_phase`` for custom loops).

Example:
    >>> import horovod.tensorflow as hvd
    >>> hvd.init()
    >>> model = htf.keras.optimize(build_model())
    >>> with tf.GradientTape() as tape:
    ...     loss = loss_fn(y, model(x, training=True))
    >>> tape = htf.horovod.DistributedGradientTape(tape, model)
    >>> optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
"""

from __future__ import annotations

import contextlib

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.gradients import check_horovod_reduction
from hybridtf._src.distribute.watchdog import collective_timeout, set_collective_timeout
from hybridtf._src.distribute.world import World, current_world


def _storage(obj):
    runtime = getattr(obj, "_htf_runtime", None)
    if runtime is None:
        raise TypeError(
            f"expected a model returned by hybridtf.keras.optimize or a hybridtf.embedding.Tables, got "
            f"{type(obj).__name__}."
        )
    return runtime.storage


def local_variables(*objs) -> list:
    """This rank's shards of the packed tables of ``objs`` (optimized models, ``Tables``, or models holding them).

    Also the distinct-rows buffers of their ``DynamicEmbedding`` tables
    sharded by id over the ranks (their owners sum every rank's rows).

    Their gradients are model-parallel: they must not be allreduced, and a
    broadcast from rank 0 must not overwrite them. Register them with
    ``tape.register_local_source`` / ``optimizer.register_local_var`` /
    ``callback.register_local_var`` when you use Horovod's tools directly.

    Raises:
        TypeError: an object that is neither.

    Example:
        >>> tape = hvd.DistributedGradientTape(tf.GradientTape())  # doctest: +SKIP
        >>> for v in htf.horovod.local_variables(model):  # doctest: +SKIP
        ...     tape.register_local_source(v)
    """
    from hybridtf._src.distribute.dynamic_exchange import sharded_dynamic_buffers

    out = []
    for obj in objs:
        buffers = sharded_dynamic_buffers(obj)
        modules = getattr(obj, "_flatten_modules", lambda **_: [])(include_self=False)
        # the object itself when optimized or a Tables, and every Tables set (or packed layer) it holds
        owners = [m for m in [obj, *modules] if getattr(getattr(m, "_htf_runtime", None), "storage", None) is not None]
        if not owners and not buffers:
            _storage(obj)  # raises: names what is expected
        for owner in owners:
            out.extend(_storage(owner).sharded_variables())
        out.extend(buffers)
    unique = {id(v): v for v in out}
    return list(unique.values())


def DistributedGradientTape(tape, *objs, **kwargs):
    """``hvd.DistributedGradientTape(tape, **kwargs)`` with the shards of ``objs`` registered as local sources.

    Args:
        tape: a ``tf.GradientTape``.
        *objs: the optimized models / ``Tables`` whose tables the step trains.
        **kwargs: passed to ``hvd.DistributedGradientTape`` (``op`` must stay
            ``hvd.Average``: the shards' gradients are scaled by ``1 / size``).

    Returns:
        The Horovod tape: dense gradients averaged, shard gradients local
        (already holding every rank's rows) and divided by the size.

    Example:
        >>> with tf.GradientTape() as tape:  # doctest: +SKIP
        ...     loss = loss_fn(y, model(x, training=True))
        >>> tape = htf.horovod.DistributedGradientTape(tape, model)  # doctest: +SKIP
        >>> grads = tape.gradient(loss, model.trainable_variables)  # doctest: +SKIP
    """
    import horovod.tensorflow as hvd

    check_horovod_reduction(
        "hybridtf.horovod.DistributedGradientTape",
        kwargs.get("op", hvd.Average),
        kwargs.get("scale_local_gradients", True),
    )
    distributed = hvd.DistributedGradientTape(tape, **kwargs)
    for var in local_variables(*objs):
        distributed.register_local_source(var)
    return distributed


def average_gradients(grads, variables, *objs) -> list:
    """Averages a step's gradients over the ranks, keeping the shards of ``objs`` local (scaled by ``1 / size``).

    For gradients computed without a tape you can wrap, e.g. by
    ``hybridtf.micro_batch_gradients`` (one reduction per step, after the
    micro-batches): dense gradients are allreduced (``Average``), replicated
    tables' sparse gradients allgathered, shard gradients only divided by the
    size (the owner already received every rank's rows). Without Horovod (or
    with one rank) the gradients come back unchanged.

    Args:
        grads: one gradient (or None) per variable.
        variables: the variables.
        *objs: the optimized models / ``Tables`` whose shards are among ``variables``.

    Returns:
        The averaged gradients, in order.

    Example:
        >>> loss, grads = htf.micro_batch_gradients(loss_fn, batch, model.trainable_variables, micro_batches=4)
        >>> grads = htf.horovod.average_gradients(grads, model.trainable_variables, model)
    """
    from hybridtf._src.distribute.gradients import reduce_gradients

    world = current_world()
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"average_gradients: {len(grads)} gradients for {len(variables)} variables.")
    if not world.distributed:
        return grads
    sharded = {id(v) for v in local_variables(*objs)}
    return [g for g, _ in reduce_gradients(list(zip(grads, variables)), sharded, world)]


def DistributedOptimizer(optimizer, **kwargs):
    """``hvd.DistributedOptimizer(optimizer, **kwargs)`` that keeps hybridtf's shards local.

    For optimizers in TF1 graphs (an Estimator model_fn): before Horovod
    reduces the gradients, the shards created in the graph are registered as
    Horovod local variables — not allreduced, scaled by ``1 / size``. That
    covers ``tf.compat.v1.train`` optimizers (at ``compute_gradients``:
    ``minimize``) and ``tf.keras.optimizers.legacy`` ones (``get_updates``,
    ``minimize``: a canned Estimator's ``dnn_optimizer`` / ``linear_optimizer``).
    Keras ``fit`` of an optimized model needs nothing extra (the compile hook
    registers them), so this works there too.

    Args:
        optimizer: a ``tf.compat.v1.train.Optimizer`` or Keras optimizer.
        **kwargs: passed to ``hvd.DistributedOptimizer``.

    Returns:
        Horovod's distributed optimizer.

    Example:
        >>> opt = htf.horovod.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
        >>> train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        >>> canned = tf.estimator.DNNClassifier(..., optimizer=lambda: htf.horovod.DistributedOptimizer(
        ...     tf.keras.optimizers.legacy.Adagrad(0.05)))
    """
    import horovod.tensorflow as hvd

    from hybridtf._src.integrations.horovod_hooks import LOCAL_VARIABLES

    check_horovod_reduction(
        "hybridtf.horovod.DistributedOptimizer",
        kwargs.get("op", hvd.Average),
        kwargs.get("scale_local_gradients", True),
    )
    distributed = hvd.DistributedOptimizer(optimizer, **kwargs)
    if not hasattr(distributed, "register_local_var"):
        return distributed

    def register_shards():
        import tensorflow as tf

        for var in tf.compat.v1.get_collection(LOCAL_VARIABLES):
            distributed.register_local_var(var)

    # A TF1 optimizer reduces in compute_gradients (minimize). Horovod's Keras optimizer reduces in _allreduce,
    # which each of its ways to gradients calls: get_gradients (get_updates: what canned Estimators call),
    # compute_gradients and _compute_gradients (minimize).
    for method in ("compute_gradients", "_allreduce"):
        original = getattr(distributed, method, None)
        if original is not None:
            setattr(distributed, method, _registering_first(register_shards, original))
    return distributed


def _registering_first(register, method):
    def call(*args, **kwargs):
        register()
        return method(*args, **kwargs)

    return call


@contextlib.contextmanager
def collective_phase(name: str = "step"):
    """Bounds the wait of a block that runs hybridtf collectives (custom training loops).

    Keras ``fit`` / ``evaluate`` / ``predict`` and ``save_weights`` of an
    optimized model are bounded already. In a custom loop, wrap each call of
    the step function: if the other ranks do not join its collectives within
    ``collective_timeout()`` seconds (``HYBRIDTF_COLLECTIVE_TIMEOUT_S``,
    default 35; ``0`` disables), every rank ends with an error that says
    which phase each rank was in, instead of waiting forever. Does nothing
    with one process. The first call also traces the step: keep the timeout
    above the tracing time.

    Args:
        name: shown in the error (e.g. ``"train step"``), numbered per name.

    Raises:
        hybridtf.errors.CollectiveTimeoutError: the wait passed the timeout.
        hybridtf.errors.CollectiveAbortedError: another rank ended the job
            while this rank was in the block.

    Example:
        >>> for x, y in dataset:
        ...     with htf.horovod.collective_phase("train step"):
        ...         loss = step(x, y)
    """
    seq = watchdog.next_seq(f"custom:{name}")
    with watchdog.collective_phase(current_world(), watchdog.CUSTOM, name, seq, first=seq == 1):
        yield


def world() -> World:
    """The Horovod job hybridtf sees (rank, size); ``World(0, 1)`` without Horovod.

    Example:
        >>> htf.horovod.world()  # one process, or before hvd.init()  # doctest: +SKIP
        World(rank=0, size=1)
    """
    return current_world()


__all__ = [
    "DistributedGradientTape",
    "DistributedOptimizer",
    "World",
    "average_gradients",
    "collective_phase",
    "collective_timeout",
    "local_variables",
    "set_collective_timeout",
    "world",
]

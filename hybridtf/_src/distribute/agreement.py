"""Every rank of a Horovod job must optimize the same model with the same settings.

The packing plan decides which collectives each training step runs (which tables are sharded, how their
rows are spread, which ones are replicated), so ranks that planned differently exchange rows that do not
match: an id outside the table's rows on one rank, or a step where every rank waits in a different
collective. ``check_same_settings`` compares a digest of each setting over the ranks (one allgather when
``optimize`` runs) and names the ones that differ.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import tensorflow as tf

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World


def digest(value) -> int:
    """A stable int64 digest of ``repr(value)`` (the same in every process)."""
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "little", signed=True)


def variables_only(weights) -> list:
    """``weights`` (a model's ``variables`` / ``weights``) without what is not a variable: a Keras lookup layer
    (``StringLookup``, ``IntegerLookup``, ``TextVectorization``) adapted, or given its vocabulary after it was made,
    lists a ``VocabWeightHandler`` among its weights, with no name, shape, dtype or value (``optimize`` of such a
    model failed with AttributeError; found by a probe)."""
    return [w for w in weights if isinstance(w, tf.Variable) or hasattr(w, "dtype")]


_SAME_MODEL = (
    "Every rank must build the same model and call hybridtf.keras.optimize with the same arguments: the packing "
    "decides which rows each rank holds and exchanges."
)


def check_same_settings(
    world: World,
    settings: dict,
    what: str,
    hints: dict | None = None,
    fix: str = _SAME_MODEL,
    phase: str = watchdog.INITIAL_BROADCAST,
) -> None:
    """Raises ValueError naming the settings whose values differ between the ranks (``world`` distributed).

    Args:
        world: the job.
        settings: setting name -> value (compared by ``repr``), in the same order on every rank.
        what: the model or model_fn, for the message.
        hints: setting name -> a sentence added to the message when that setting differs.
        fix: what to do, after the settings that differ (default: build and optimize the same model).
        phase: the collective phase the allgather is armed as (what a diverged rank's error names).
    """
    if not world.distributed or not settings:
        return
    names = list(settings)
    differ, _ = _compare(
        world,
        names,
        [digest(settings[n]) for n in names],
        phase,
        f"{what}: the ranks' settings",
        "hybridtf_optimize_settings",
    )
    if differ is None:
        raise ValueError(
            f"{what}: the Horovod ranks optimize different sets of settings; build and optimize the same model with "
            "the same hybridtf.keras.optimize arguments on every rank."
        )
    if differ:
        raise ValueError(
            f"{what}: the Horovod ranks differ in {', '.join(differ)} (this rank, {world.rank}: "
            + "; ".join(_shown(name, settings[name]) for name in differ)
            + f"; each rank reports its own). {fix}"
            + "".join(" " + hints[name] for name in differ if name in (hints or {}))
        )


_SAME_CHECKPOINT = (
    "Every rank must load the same checkpoint (the same path on a shared file system, or identical copies), or "
    "each would train its own dense layers."
)


def check_same_restored_values(world: World, variables: list, what: str, fix: str = _SAME_CHECKPOINT) -> None:
    """Raises ValueError when the ranks hold different values of replicated ``variables`` after a restore.

    Every rank of a data-parallel job must restore the same checkpoint: a rank that read another one (a local
    copy of another step, an initial checkpoint) would train other dense layers than the others, silently. One
    allgather of a digest (CRC-32 of the bytes, shape and dtype) per variable.

    Args:
        world: the job (nothing is checked in one process).
        variables: the replicated variables (not the rank-local shards), in the same order on every rank.
        what: the call, for the message.
        fix: what to do, after what differs.
    """
    if not world.distributed:
        return
    names = [v.name for v in variables]
    differ, values = _compare(
        world,
        names,
        [_value_digest(v) for v in variables],
        watchdog.CHECKPOINT_GATHER,
        f"{what}: the ranks' restored values",
        "hybridtf_restored_values",
    )
    if differ is None:
        raise ValueError(
            f"{what}: the Horovod ranks hold different sets of variables after the restore (they built different "
            f"models, or restored different checkpoints, one with the optimizer's state). Every rank must build the "
            f"same model. {fix}"
        )
    if differ:
        ranks = [r for r in range(values.shape[0]) if (values[r] != values[0]).any()]
        raise ValueError(
            f"{what}: after the restore the Horovod ranks hold different values of {len(differ)} replicated "
            f"variable(s) ({', '.join(repr(n) for n in differ[:5])}{', ...' if len(differ) > 5 else ''}; ranks "
            f"{ranks} differ from rank 0): the ranks restored different checkpoints. {fix}"
        )


def check_model_restored(
    model, world: World, local: list, what: str = "load_weights", fix: str = _SAME_CHECKPOINT
) -> None:
    """``check_same_restored_values`` over a Keras model's variables and its optimizer's, but ``local`` ones
    (``what``: the call that restored them, for the message)."""
    if not world.distributed:
        return
    optimizer = getattr(model, "optimizer", None)
    optimizer_variables = getattr(optimizer, "variables", None) if optimizer is not None else None
    optimizer_variables = optimizer_variables() if callable(optimizer_variables) else optimizer_variables
    skip = {id(v) for v in local}
    chosen, seen = [], set()
    for variable in [*model.variables, *(optimizer_variables or [])]:
        if id(variable) not in skip and id(variable) not in seen and hasattr(variable, "numpy"):
            seen.add(id(variable))
            chosen.append(variable)
    check_same_restored_values(world, chosen, f"model {model.name!r}: {what}", fix)


def _compare(world: World, names: list, values: list, phase: str, detail: str, collective: str):
    """One allgather of each rank's ``(digest(name), value)`` columns, armed as ``phase``.

    Returns:
        ``(names whose values differ between the ranks, the gathered values [ranks, names])``, or ``(None, ...)``
        when the ranks' names differ.
    """
    local = tf.constant([[digest(n) for n in names] + list(values)], tf.int64)
    with watchdog.collective_phase(world, phase, detail):
        gathered = np.asarray(world.hvd.allgather(local, name=collective))
    k = len(names)
    if gathered.shape[1] != local.shape[1] or (gathered[:, :k] != gathered[0, :k]).any():
        return None, gathered
    values = gathered[:, k:]
    return [n for i, n in enumerate(names) if (values[:, i] != values[0, i]).any()], values


def _value_digest(variable) -> int:
    value = np.ascontiguousarray(variable.numpy())
    return zlib.crc32(value.tobytes(), zlib.crc32(repr((value.shape, value.dtype.str)).encode()))


def _shown(name: str, value, limit: int = 1200) -> str:
    """``name=value`` for a message, cut (marked) past ``limit`` characters."""
    text = f"{name}={value!r}"
    return text if len(text) <= limit else text[: limit - 3] + "..."

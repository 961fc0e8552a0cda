"""Bounded waits in hybridtf's collectives: no rank of a Horovod job waits forever for the others.

A Horovod collective completes only when every rank submits it. When the
ranks diverge — one has more batches than another, or one calls
``save_weights`` / ``evaluate`` / ``predict`` while another is still
training — each rank waits in a different collective and, under Gloo, nothing
ever ends the job (Horovod 0.28's stall inspector stays silent there).

Every collective *phase* hybridtf runs from Python (a Keras training,
evaluation or prediction call, the checkpoint gather — also an Estimator's
checkpoint save, until its gather completed: ``joined_marker`` —, an Estimator's
step's ``Session.run`` — ``estimator_step_watchdog`` —, the initial
broadcast, a custom step guarded with ``hybridtf.horovod.collective_phase``) is
*armed* here: a deadline of ``collective_timeout()`` seconds
(``HYBRIDTF_COLLECTIVE_TIMEOUT_S``, default 35; ``0`` disables). Arming and
disarming cost two dictionary updates under a lock; one daemon thread per
process polls the deadlines twice a second. Time spent tracing a step function
(``paused_for_tracing``) does not count.

When a deadline passes on a rank, its watchdog thread:

1. asks the other ranks which phase they are in: an allgather named
   ``hybridtf_watchdog_diagnosis`` that every rank whose own deadline passed
   submits too, awaited for at most ``min(15, timeout)`` seconds (the first
   call of a step function gets half of that on top of its deadline: ranks
   trace at different speeds, and a later deadline still joins the diagnosis);
2. prints the diagnosis to stderr (which collective, which rank is where,
   what to do), and keeps it for the exception;
3. shuts Horovod down (``hvd.shutdown()``), which fails the pending collective
   on this rank and on every other rank within a second or two (Gloo); the
   waiting thread and the script's exit wait for that shutdown to finish (a
   second ``hvd.shutdown()`` while the first is joining Horovod's thread never
   returns);
4. if the waiting thread has not come back within 5 s, ends the process
   with exit status ``EXIT_STATUS``.

The waiting thread then raises ``CollectiveTimeoutError`` with the diagnosis.
A rank whose collective fails because another rank shut Horovod down (that
rank timed out, raised, finished its script or was killed) raises
``CollectiveAbortedError`` naming its own phase. Uncaught, both end the
script with a non-zero status: every rank ends within
``timeout + min(15, timeout)`` seconds (``timeout + 1.5 min(15, timeout)`` in
the first call of a step function), 50 s (57.5 s) by default, plus the
fraction of a second Horovod takes to shut down.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import sys
import threading
import time

import numpy as np

from hybridtf._src.distribute.world import World
from hybridtf._src.errors import CollectiveAbortedError, CollectiveTimeoutError

TIMEOUT_ENV = "HYBRIDTF_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 35.0
EXIT_STATUS = 75
_POLL_S = 0.5
_EXIT_GRACE_S = 5.0
_MAX_DIAGNOSIS_S = 15.0

# Phase names; their index is the code exchanged in the diagnosis.
TRAINING_STEP = "training step"
EVALUATION_STEP = "evaluation step"
PREDICTION_STEP = "prediction step"
CHECKPOINT_GATHER = "checkpoint gather"
INITIAL_BROADCAST = "initial broadcast"
CUSTOM = "custom phase"
EPOCH_END = "end of epoch"
PHASES = (TRAINING_STEP, EVALUATION_STEP, PREDICTION_STEP, CHECKPOINT_GATHER, INITIAL_BROADCAST, CUSTOM, EPOCH_END)

_HOROVOD_SHUT_DOWN = "Horovod has been shut down"

_override: float | None = None
_parsed: tuple[str | None, float] = (None, DEFAULT_TIMEOUT_S)


def set_collective_timeout(seconds: float | None) -> None:
    """Sets the collective timeout of this process (overrides ``HYBRIDTF_COLLECTIVE_TIMEOUT_S``).

    Args:
        seconds: the limit; ``0`` disables the watchdog; ``None`` goes back
            to the environment variable / the default.

    Raises:
        ValueError: a negative or non-finite number.

    Example:
        >>> set_collective_timeout(120)  # a slow first step (a large warm start) on every rank
        >>> collective_timeout()
        120.0
        >>> set_collective_timeout(None)  # back to HYBRIDTF_COLLECTIVE_TIMEOUT_S / 35 s
    """
    global _override
    if seconds is not None:
        seconds = _check_seconds(seconds, "set_collective_timeout")
    _override = seconds


def _check_seconds(value, source: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"{source}: the collective timeout must be a finite number of seconds >= 0 (0 disables the "
            f"watchdog), got {value!r}."
        )
    return seconds


def diagnosis_grace(timeout: float) -> float:
    """How long a rank whose deadline passed waits for the others to report their phases: ``min(15, timeout)``."""
    return min(_MAX_DIAGNOSIS_S, timeout)


def collective_timeout() -> float | None:
    """Seconds a rank may wait in one collective phase; ``None`` when disabled.

    Raises:
        ValueError: ``HYBRIDTF_COLLECTIVE_TIMEOUT_S`` is not a number >= 0.

    Example:
        >>> collective_timeout()  # the default, without HYBRIDTF_COLLECTIVE_TIMEOUT_S  # doctest: +SKIP
        35.0
    """
    global _parsed
    seconds = _override
    if seconds is None:
        raw = os.environ.get(TIMEOUT_ENV, "")
        if _parsed[0] != raw:  # parsed once per value: this runs at every step call
            _parsed = (raw, _check_seconds(raw, TIMEOUT_ENV) if raw.strip() else DEFAULT_TIMEOUT_S)
        seconds = _parsed[1]
    return seconds or None


@dataclasses.dataclass(eq=False)
class _Armed:
    phase: str
    detail: str
    seq: int
    timeout: float
    limit: float
    grace: float
    deadline: float
    thread: int
    paused: int = 0
    message: str | None = None
    firing: bool = False  # the watchdog thread took this deadline (under the watchdog's lock)
    failed: bool = False  # the body raised: the watchdog no longer takes it (under the watchdog's lock)
    left: threading.Event = dataclasses.field(default_factory=threading.Event)
    diagnosed: threading.Event = dataclasses.field(default_factory=threading.Event)

    def describe(self) -> str:
        return _describe(self.phase, self.seq) + (f" ({self.detail})" if self.detail else "")


class _Watchdog:
    """The process's deadlines and the daemon thread that enforces them."""

    def __init__(self, world: World):
        self.world = world
        self._lock = threading.Lock()
        self._armed: dict[int, _Armed] = {}
        self._next = 0
        self._fired = False
        self._thread = threading.Thread(target=self._loop, name="hybridtf-collective-watchdog", daemon=True)
        self._thread.start()

    def arm(self, phase: str, detail: str, seq: int, timeout: float, first: bool) -> tuple[int, _Armed]:
        limit, grace = timeout, diagnosis_grace(timeout)
        if first:  # the other ranks may still be tracing: half the grace more, so they still join the diagnosis
            timeout += grace / 2
        armed = _Armed(phase, detail, seq, timeout, limit, grace, time.monotonic() + timeout, threading.get_ident())
        with self._lock:
            self._next += 1
            key = self._next
            self._armed[key] = armed
        return key, armed

    def disarm(self, key: int) -> None:
        with self._lock:
            armed = self._armed.pop(key, None)
        if armed is not None:
            armed.left.set()

    def settle(self, armed: _Armed) -> None:
        """The body failed: if the watchdog already took this deadline, waits for its diagnosis.

        Another rank's diagnosis can finish first and shut Horovod down while this rank's is still exchanging
        phases: the body then fails with Horovod's shutdown error, and the error raised must still be the
        timeout with its diagnosis, not an abort blaming the other rank. Marked under the lock, so the watchdog
        either took it already (wait) or never will.
        """
        with self._lock:
            armed.failed = True
            firing = armed.firing
        if firing:
            armed.diagnosed.wait(armed.grace + _EXIT_GRACE_S)

    def pause(self, thread: int, delta: int) -> None:
        now = time.monotonic()
        with self._lock:
            for armed in self._armed.values():
                if armed.thread == thread:
                    armed.paused += delta
                    if not armed.paused:
                        armed.deadline = now + armed.timeout

    def _loop(self) -> None:
        while True:
            time.sleep(_POLL_S)
            now = time.monotonic()
            with self._lock:
                expired = [a for a in self._armed.values() if not (a.paused or a.failed) and a.deadline <= now]
                if not expired or self._fired:
                    continue
                self._fired = True
                first = min(expired, key=lambda a: a.deadline)
                first.firing = True
            self._fire(first)
            return

    def _fire(self, armed: _Armed) -> None:
        world = self.world
        grace = armed.grace
        try:
            others = _diagnose(world, PHASES.index(armed.phase), armed.seq, grace)
            armed.message = _timeout_message(world, armed, others, grace)
            _print(armed.message)
            _shut_down(world, published=armed.diagnosed)
        finally:
            armed.diagnosed.set()
        if not armed.left.wait(_EXIT_GRACE_S):
            _print(f"hybridtf: rank {world.rank} did not leave the collective after Horovod shut down; exiting.")
            os._exit(EXIT_STATUS)


def _shut_down(world: World, published: threading.Event | None = None) -> None:
    """``hvd.shutdown()`` in its own thread, waited for at most ``_EXIT_GRACE_S``.

    Horovod's shutdown joins its background thread, and a second shutdown while the first is still joining
    (Horovod's own ``atexit`` one, once the failed collective ends the script, or the caller's) joins the same
    thread twice and never returns: both ranks of a job hung that way at exit. So the waiting thread waits for
    this shutdown before it raises, and an ``atexit`` hook that runs before Horovod's waits for it too (or
    ends the process when Horovod never finished).
    """
    global _closer
    closer = threading.Thread(target=_shutdown_horovod, args=(world,), name="hybridtf-watchdog-shutdown", daemon=True)
    atexit.register(_await_shutdown_at_exit)  # registered after hvd.init's: runs first
    with _lock:  # started before it is published: a thread in await_shutdown never joins an unstarted one
        closer.start()
        _closer = closer
    if published is not None:  # a failed body waiting in ``settle`` may now raise: ``await_shutdown`` sees it
        published.set()
    closer.join(_EXIT_GRACE_S)


def _shutdown_horovod(world: World) -> None:
    with contextlib.suppress(Exception):
        world.hvd.shutdown()


def await_shutdown(timeout: float = _EXIT_GRACE_S) -> bool:
    """Waits for a watchdog's ``hvd.shutdown()`` in progress; ``False`` if it is still running."""
    with _lock:
        closer = _closer
    if closer is None:
        return True
    closer.join(timeout)
    return not closer.is_alive()


def _await_shutdown_at_exit() -> None:
    if not await_shutdown(2 * _EXIT_GRACE_S):
        _print("hybridtf: Horovod did not finish shutting down after the collective failed; exiting.")
        os._exit(EXIT_STATUS)


def _print(message: str) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _diagnose(world: World, code: int, seq: int, grace: float) -> dict[int, tuple[int, int]] | None:
    """Every rank whose watchdog fired too: rank -> (phase code, seq); ``None`` if they did not all answer."""
    result: dict = {}

    def exchange():
        try:
            import numpy as np
            import tensorflow as tf

            @tf.function(autograph=False)
            def allgather(row):
                return world.hvd.allgather(row, name="hybridtf_watchdog_diagnosis")

            rows = allgather(tf.constant(np.array([[world.rank, code, seq]], np.int64))).numpy()
            result["rows"] = {int(r): (int(c), int(s)) for r, c, s in rows}
        except Exception as err:  # Horovod shut down by another rank meanwhile
            result["error"] = err

    thread = threading.Thread(target=exchange, name="hybridtf-watchdog-diagnosis", daemon=True)
    thread.start()
    thread.join(grace)
    return result.get("rows")


def _describe(phase: str, seq: int) -> str:
    return f"{phase} #{seq}" if seq else phase


def _phase_name(code: int) -> str:
    return PHASES[code] if 0 <= code < len(PHASES) else f"phase {code}"


def _timeout_message(world: World, armed: _Armed, others, grace: float) -> str:
    lines = [
        f"hybridtf: rank {world.rank} of {world.size} waited {armed.timeout:g} s in the collective "
        f"{armed.describe()} without every rank joining it (hybridtf collective watchdog)."
    ]
    if others is not None:
        lines.append("Where each rank is:")
        for rank in sorted(others):
            code, seq = others[rank]
            mark = "  <- this rank" if rank == world.rank else ""
            lines.append(f"  rank {rank}: {_describe(_phase_name(code), seq)}{mark}")
        if len(set(others.values())) == 1 and len(others) == world.size:
            lines.append(
                "Every rank is in the same collective: the ranks did not diverge, this phase is slower than the "
                f"limit (a first call also traces the step function). Raise {TIMEOUT_ENV} above its duration."
            )
            lines.append(
                f"Ending every rank: Horovod is shut down on this one. The limit is {TIMEOUT_ENV}={armed.limit:g}."
            )
            return "\n".join(lines)
        if len({code for code, _ in others.values()}) > 1:
            lines.append("The ranks reached different collectives.")
    else:
        lines.append(
            f"  this rank: {armed.describe()}; the other ranks did not report within {grace:g} s: "
            "they are not waiting in a hybridtf collective (a rank finished its data and went on, is in other "
            "code — e.g. one rank's long predict —, or is slow); their own stderr may say where they are."
        )
    lines.append(
        "Likely cause: the ranks ran different numbers of batches (uneven data per rank) or not every rank "
        "called save_weights / load_weights / evaluate / predict / an export (model.export, tf.saved_model.save). "
        "Give every rank the same number of batches (split the data evenly, drop_remainder=True, or "
        "steps_per_epoch / steps; an Estimator's train / evaluate: the same steps / max_steps) and call these on "
        "every rank. "
        "A callback deciding on a rank's own metrics (ModelCheckpoint(save_best_only=True), EarlyStopping, "
        "ReduceLROnPlateau) decides differently on each rank: put hvd.callbacks.MetricAverageCallback() before it "
        "(it averages the metrics at each epoch's end)."
    )
    lines.append(
        f"Ending every rank: Horovod is shut down on this one. The limit is {TIMEOUT_ENV}={armed.limit:g} "
        "(seconds; 0 disables) or hybridtf.horovod.set_collective_timeout()."
    )
    return "\n".join(lines)


_lock = threading.Lock()
_closer: threading.Thread | None = None  # the watchdog's hvd.shutdown(), once one fired
_local = threading.local()
_watchdogs: dict[int, _Watchdog] = {}
_counters: dict[str, int] = {}
_joinable: dict[int, _Watchdog] = {}  # armed session-run phases (key -> watchdog) that joined_marker disarms


def _watchdog(world: World) -> _Watchdog:
    with _lock:
        dog = _watchdogs.get(id(world.hvd))
        if dog is None:
            dog = _watchdogs[id(world.hvd)] = _Watchdog(world)
        return dog


def next_seq(counter: str) -> int:
    """1, 2, ... per ``counter`` name (e.g. one per model function), for the diagnosis."""
    with _lock:
        _counters[counter] = _counters.get(counter, 0) + 1
        return _counters[counter]


@contextlib.contextmanager
def collective_phase(
    world: World,
    phase: str,
    detail: str = "",
    seq: int = 0,
    first: bool = False,
    session_run: bool = False,
    session_step: bool = False,
):
    """Arms the watchdog while the body waits on the other ranks (eager code, ``world`` distributed).

    Args:
        world: the job; nothing is armed with one process, in graph mode
            (tracing) or with the timeout disabled.
        phase: one of ``PHASES``.
        detail: shown next to the phase (e.g. the model's name).
        seq: the call number, shown as ``#seq``.
        first: the first call of a step function: the deadline is
            ``diagnosis_grace(timeout) / 2`` later (the other ranks may trace
            more slowly).
        session_run: the body runs a TF1 ``Session`` (an Estimator's checkpoint save),
            armed in graph mode too; ``joined_marker`` ops in the run's graph disarm it
            once every rank joined (see ``joined_marker``).
        session_step: the body is one ``Session.run`` of an Estimator's step
            (``estimator_step_watchdog``), armed in graph mode too, for the whole run.

    Raises:
        CollectiveTimeoutError: this rank's deadline passed (the diagnosis
            was printed to stderr first).
        CollectiveAbortedError: another rank shut Horovod down while this
            rank was in the phase.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown collective phase {phase!r}; one of {PHASES}.")
    timeout = collective_timeout() if world.distributed else None
    if timeout is None or getattr(_local, "depth", 0) or not (session_run or session_step or _executing_eagerly()):
        yield  # nested phases are covered by the outer one
        return
    dog = _watchdog(world)
    key, armed = dog.arm(phase, detail, seq, timeout, first)
    _local.depth = 1
    if session_run:
        with _lock:
            _joinable[key] = dog
    try:
        yield
    except Exception as err:
        dog.settle(armed)
        await_shutdown()  # before the caller or the script's exit can start a second, hanging hvd.shutdown()
        if armed.message is not None:
            raise CollectiveTimeoutError(armed.message) from err
        if _HOROVOD_SHUT_DOWN in str(err):
            message = (
                f"hybridtf: rank {world.rank} of {world.size} was in the collective {armed.describe()} "
                "when another rank ended the job (it timed out waiting in another collective, raised an error, "
                "finished its script or was killed: its stderr says which). Usually the ranks ran different "
                "numbers of batches, or not every rank called save_weights / load_weights / evaluate / predict."
            )
            _print(message)  # before the launcher terminates this rank, and even if the caller swallows it
            raise CollectiveAbortedError(message) from err
        raise
    finally:
        _local.depth = 0
        with _lock:
            _joinable.pop(key, None)
        dog.disarm(key)
    if armed.message is not None:  # returned just as the deadline passed: Horovod is shut down anyway
        await_shutdown()
        raise CollectiveTimeoutError(armed.message)


def _mark_joined(_values) -> np.int64:
    """Disarms the session-run phases armed now: a collective of their run completed on every rank."""
    with _lock:
        joined = list(_joinable.items())
        _joinable.clear()
    for key, dog in joined:
        dog.disarm(key)
    return np.int64(0)


def joined_marker(tensor):
    """``tensor``, passed on only after an op has disarmed the session-run phases armed when it runs.

    For a collective's output in a TF1 graph (an Estimator checkpoint's gather of sharded tables): once it
    exists every rank has joined, so what the run does after it (writing the files, as long as it takes) is
    not timed. The phase thus bounds a rank that waits in the gather for ranks that never come.
    """
    import tensorflow as tf

    # An element of the tensor's values, not its size: a static size is folded to a constant, and the marker
    # would run before the collective.
    first = tf.reshape(tensor, [-1])[:1]
    done = tf.numpy_function(_mark_joined, [first], tf.int64, name="hybridtf_collective_joined")
    with tf.control_dependencies([done]):
        return tf.identity(tensor)


@contextlib.contextmanager
def paused_for_tracing():
    """Stops the clock of the calling thread's armed phases while a step function is traced.

    Nothing is paused when the body runs eagerly (``run_eagerly=True``): then it is the step itself.
    """
    dogs = list(_watchdogs.values()) if _watchdogs and not _executing_eagerly() else []
    thread = threading.get_ident()
    for dog in dogs:
        dog.pause(thread, +1)
    try:
        yield
    finally:
        for dog in dogs:
            dog.pause(thread, -1)


def _executing_eagerly() -> bool:
    from tensorflow.python.eager import context

    return context.executing_eagerly()

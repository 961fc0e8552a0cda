"""The collective watchdog's settings and its last resort, in one process (the rank faults: tests/multiprocess)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import pytest

import hybridtf as htf
from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World


@pytest.fixture(autouse=True)
def _no_override():
    watchdog.set_collective_timeout(None)
    yield
    watchdog.set_collective_timeout(None)


def test_timeout_comes_from_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv(watchdog.TIMEOUT_ENV, raising=False)
    assert watchdog.collective_timeout() == watchdog.DEFAULT_TIMEOUT_S == 35
    # every rank ends within timeout + diagnosis grace (+ half of it in a first call): under 60 s by default
    assert watchdog.DEFAULT_TIMEOUT_S + 1.5 * watchdog.diagnosis_grace(watchdog.DEFAULT_TIMEOUT_S) < 60
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, " 12.5 ")
    assert htf.horovod.collective_timeout() == 12.5
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "0")
    assert watchdog.collective_timeout() is None  # disabled
    htf.horovod.set_collective_timeout(7)
    assert watchdog.collective_timeout() == 7  # the call wins over the environment
    htf.horovod.set_collective_timeout(None)
    assert watchdog.collective_timeout() is None


@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan"])
def test_bad_timeouts_name_the_setting(monkeypatch, value):
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"{watchdog.TIMEOUT_ENV}: the collective timeout must be a finite"):
        watchdog.collective_timeout()
    with pytest.raises(ValueError, match=r"set_collective_timeout: .* got"):
        htf.horovod.set_collective_timeout(value)


def test_one_process_arms_nothing_and_passes_errors_through():
    with htf.horovod.collective_phase("train step"):
        pass
    with pytest.raises(KeyError), watchdog.collective_phase(World(), watchdog.TRAINING_STEP):
        raise KeyError("mine")
    with pytest.raises(ValueError, match="unknown collective phase"), watchdog.collective_phase(World(), "nap"):
        pass
    assert not watchdog._watchdogs  # no thread started


def test_errors_are_public():
    assert issubclass(htf.errors.CollectiveTimeoutError, htf.errors.HybridTFError)
    assert issubclass(htf.errors.CollectiveAbortedError, RuntimeError)


_STUCK = """
import sys, time
import horovod.tensorflow as hvd
import tensorflow as tf
from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World

hvd.init()
world = World(0, 2, hvd)  # armed as a rank of two; a one-process Horovod answers the diagnosis
watchdog.set_collective_timeout(1)
with watchdog.collective_phase(world, watchdog.TRAINING_STEP, "model 'm'", 3):
    with tf.Graph().as_default(), watchdog.paused_for_tracing():
        time.sleep(2.5)  # tracing (graph mode): not waiting on the others
    print("traced", flush=True)
    with watchdog.paused_for_tracing():  # eager (run_eagerly=True): the step itself, the clock runs
        time.sleep(60)  # not a collective Horovod could fail: the watchdog must end the process
print("returned", flush=True)
"""


def test_a_rank_stuck_past_the_deadline_is_ended():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _STUCK], capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode == watchdog.EXIT_STATUS, proc.stderr[-3000:]
    assert proc.stdout.split() == ["traced"]
    err = proc.stderr
    assert "hybridtf: rank 0 of 2 waited 1 s in the collective training step #3 (model 'm')" in err
    assert "rank 0: training step #3  <- this rank" in err  # the diagnosis allgather ran
    assert "did not leave the collective after Horovod shut down; exiting." in err
    assert elapsed < 40, elapsed  # import + 2.5 s traced + 1 s + grace 1 s + 5 s exit grace


_SLOW_SHUTDOWN = """
import atexit, threading, time
from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World
from hybridtf.errors import CollectiveTimeoutError


class SlowHorovod:  # Horovod whose shutdown joins its background thread for a while (a loaded machine)
    def __init__(self):
        self.down, self.joining, self.joins = threading.Event(), 0, []

    def allgather(self, row, name=None):
        raise RuntimeError("no peers")  # the diagnosis gets no answer

    def shutdown(self):
        self.down.set()  # pending collectives fail now ...
        self.joining += 1
        self.joins.append(self.joining)  # 2: a second shutdown joined the same thread: Horovod never returns
        time.sleep(2)  # ... while the thread is joined
        self.joining -= 1


hvd = SlowHorovod()
atexit.register(lambda: print("most shutdowns at once:", max(hvd.joins), flush=True))  # runs last
atexit.register(hvd.shutdown)  # as hvd.init does
watchdog.set_collective_timeout(1)
try:
    with watchdog.collective_phase(World(0, 2, hvd), watchdog.TRAINING_STEP, "", 1):
        hvd.down.wait(30)
        raise RuntimeError("Horovod has been shut down")
except CollectiveTimeoutError:
    print("raised while joining:", hvd.joining > 0, flush=True)
"""


def test_the_watchdogs_shutdown_finishes_before_the_error_and_the_exit():
    """A second hvd.shutdown() while the watchdog's still joins Horovod's thread hung both ranks of a job at exit."""
    proc = subprocess.run(
        [sys.executable, "-c", _SLOW_SHUTDOWN], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["raised while joining: False", "most shutdowns at once: 1"]


_ABORTED_DURING_DIAGNOSIS = """
import threading, time
from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World
from hybridtf.errors import CollectiveAbortedError, CollectiveTimeoutError


class RacingHorovod:  # the other rank's diagnosis ends first: it shuts Horovod down while this one's exchanges
    def __init__(self):
        self.diagnosing = threading.Event()

    def allgather(self, row, name=None):
        self.diagnosing.set()
        time.sleep(1.5)
        return row

    def shutdown(self):
        pass


hvd = RacingHorovod()
watchdog.set_collective_timeout(1)
try:
    with watchdog.collective_phase(World(1, 2, hvd), watchdog.CHECKPOINT_GATHER, "Estimator checkpoint"):
        hvd.diagnosing.wait(30)
        raise RuntimeError("Horovod has been shut down")  # the other rank's shutdown reaches this rank's gather
except (CollectiveTimeoutError, CollectiveAbortedError) as err:
    print(type(err).__name__, flush=True)
"""


def test_the_other_ranks_shutdown_during_this_ranks_diagnosis_still_raises_the_timeout():
    """The body failed with Horovod's shutdown while this rank's own diagnosis was still exchanging phases: the
    rank printed the timeout's diagnosis, then raised an abort blaming the other rank (a CI run's 2-rank test)."""
    proc = subprocess.run(
        [sys.executable, "-c", _ABORTED_DURING_DIAGNOSIS], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["CollectiveTimeoutError"], proc.stderr[-3000:]
    assert "rank 1 of 2 waited 1 s in the collective checkpoint gather (Estimator checkpoint)" in proc.stderr
    assert "was in the collective" not in proc.stderr  # no abort message


def test_a_thread_awaiting_the_shutdown_never_joins_an_unstarted_one(monkeypatch):
    """A rank raised "cannot join thread before it is started" when it awaited the watchdog's shutdown
    between the shutdown thread's publication and its start."""
    seen, probes = [], []

    class Thread(threading.Thread):
        def start(self):  # another thread awaits the shutdown just as this one starts
            def probe():
                try:
                    seen.append(watchdog.await_shutdown(5))
                except RuntimeError as e:
                    seen.append(e)

            probes.append(threading.Thread(target=probe))
            probes[-1].start()
            probes[-1].join(0.3)  # it returns, fails, or waits for the shutdown's publication
            super().start()

    class Hvd:
        def shutdown(self):
            pass

    monkeypatch.setattr(watchdog, "_closer", None)
    monkeypatch.setattr(watchdog, "threading", types.SimpleNamespace(Thread=Thread))
    watchdog._shut_down(World(0, 2, Hvd()))
    probes[0].join(10)
    assert seen == [True]


def _armed(phase, seq):
    return watchdog._Armed(phase, "model 'm'", seq, 8.0, 8.0, 8.0, 0.0, 0)


def test_diagnosis_tells_diverged_ranks_from_a_slow_phase():
    world = World(1, 2, None)
    diverged = watchdog._timeout_message(world, _armed(watchdog.EVALUATION_STEP, 2), {0: (0, 4), 1: (1, 2)}, 8)
    assert "  rank 0: training step #4\n  rank 1: evaluation step #2  <- this rank" in diverged
    assert "The ranks reached different collectives." in diverged and "uneven data per rank" in diverged
    slow = watchdog._timeout_message(world, _armed(watchdog.TRAINING_STEP, 1), {0: (0, 1), 1: (0, 1)}, 8)
    assert "Every rank is in the same collective" in slow and "uneven" not in slow
    assert f"Raise {watchdog.TIMEOUT_ENV} above its duration" in slow
    alone = watchdog._timeout_message(world, _armed(watchdog.CHECKPOINT_GATHER, 0), None, 8)
    assert "this rank: checkpoint gather (model 'm'); the other ranks did not report within 8 s" in alone

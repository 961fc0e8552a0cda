"""The watchdog's Estimator step hook in one process, armed as a rank of two (the rank faults: tests/multiprocess).

Each case runs in a subprocess: the watchdog shuts Horovod down, and the step's run must raise its error; a step
that failed for another reason leaves nothing armed; one failed by another rank's shutdown names this rank's step.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_PRELUDE = """
import time
import horovod.tensorflow as hvd
import tensorflow as tf
from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import World
from hybridtf._src.integrations import estimator_step_watchdog
from hybridtf.errors import CollectiveAbortedError, CollectiveTimeoutError

hvd.init()
world = World(0, 2, hvd)  # armed as a rank of two; a one-process Horovod answers the diagnosis
watchdog.set_collective_timeout(1)


def slept(seconds, fail=False):
    def body(x):
        time.sleep(seconds)
        if fail:
            raise ValueError(fail if isinstance(fail, str) else "the step failed on purpose")
        return x

    return tf.py_function(body, [tf.constant(1.0)], tf.float32)


def run(step_seconds, steps, fail=False):
    with tf.Graph().as_default():
        step = slept(step_seconds, fail)
        hook = estimator_step_watchdog.StepWatchdogHook(world, watchdog.TRAINING_STEP, "Estimator train")
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(steps):
                sess.run(step)
"""

_STUCK_STEP = (
    _PRELUDE
    + """
run(0.0, 2)  # fast steps: armed and disarmed
print("fast steps ran", flush=True)
try:
    run(3.0, 1)  # past the deadline: the watchdog fires while the step runs; the step then returns
except CollectiveTimeoutError as err:
    print("raised:", str(err).splitlines()[0], flush=True)
"""
)

_FAILED_STEP = (
    _PRELUDE
    + """
try:
    run(0.0, 1, fail=True)
except Exception as err:
    print("failed:", type(err).__name__, flush=True)
try:  # what a collective's error says when another rank shut Horovod down
    run(0.0, 1, fail="Horovod has been shut down. This was caused by an exception on one of the ranks")
except CollectiveAbortedError as err:
    print("aborted:", str(err).split(" when ")[0], flush=True)
time.sleep(4)  # past the deadline of the step that failed: its session's close disarmed it
print("nothing fired", flush=True)
"""
)


def _run(script):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False)
    return proc, time.monotonic() - start


def test_a_step_past_the_deadline_raises_the_watchdogs_error():
    proc, elapsed = _run(_STUCK_STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "fast steps ran"
    assert lines[1] == (
        "raised: hybridtf: rank 0 of 2 waited 1.5 s in the collective training step #1 (Estimator train) without "
        "every rank joining it (hybridtf collective watchdog)."
    ), proc.stdout  # the first step of a session: half the diagnosis grace on top
    assert "rank 0: training step #1  <- this rank" in proc.stderr  # the diagnosis printed first
    assert "did not leave the collective" not in proc.stderr
    assert elapsed < 60, elapsed


def test_a_step_that_fails_otherwise_leaves_nothing_armed_and_an_abort_names_the_step():
    proc, _ = _run(_FAILED_STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "failed: InvalidArgumentError",
        "aborted: hybridtf: rank 0 of 2 was in the collective training step #1 (Estimator train)",
        "nothing fired",
    ], proc.stdout
    assert "hybridtf collective watchdog" not in proc.stderr

"""An Estimator's steps under Horovod as armed collective phases of the watchdog (no rank waits forever).

A wrapped model_fn's training step on several ranks runs collectives (the
alltoall of tables sharded over the ranks, the allreduce of dense gradients),
and so do its evaluation and prediction steps when tables are sharded. When
the ranks' inputs differ in length, a rank whose input ended saves its last
checkpoint (or evaluates, or leaves) while the others wait in their next step.
``StepWatchdogHook`` arms each step's ``Session.run`` (``before_run`` to
``after_run``) with ``watchdog.arm_session_step``: past
``HYBRIDTF_COLLECTIVE_TIMEOUT_S`` the watchdog prints its diagnosis (which
rank is in which collective), hands the ``CollectiveTimeoutError`` to the
session's coordinator and shuts Horovod down. The run then fails, and the
coordinator raises that error when the Estimator's session closes. A run that
fails for another reason (another rank shut Horovod down) disarms the step when
its session closes (the coordinator is joined then).
"""

from __future__ import annotations

import sys
import threading
import time

import tensorflow as tf

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import current_world
from hybridtf._src.errors import CollectiveTimeoutError

_PHASES = {
    tf.estimator.ModeKeys.TRAIN: watchdog.TRAINING_STEP,
    tf.estimator.ModeKeys.EVAL: watchdog.EVALUATION_STEP,
    tf.estimator.ModeKeys.PREDICT: watchdog.PREDICTION_STEP,
}
_HOOK_FIELDS = {
    tf.estimator.ModeKeys.TRAIN: "training_hooks",
    tf.estimator.ModeKeys.EVAL: "evaluation_hooks",
    tf.estimator.ModeKeys.PREDICT: "prediction_hooks",
}
_CLOSE_POLL_S = 0.05


class StepWatchdogHook(tf.compat.v1.train.SessionRunHook):
    """Arms the watchdog's collective phase around each step's ``Session.run`` (see the module docstring)."""

    def __init__(self, world, phase: str, detail: str):
        self._world = world
        self._phase = phase
        self._detail = detail
        self._counter = f"estimator-step.{id(self)}"
        self._coord = None
        self._step = None

    def after_create_session(self, session, coord):
        self._coord = coord
        threading.Thread(
            target=self._release_at_close, args=(coord,), name="hybridtf-estimator-step-watchdog", daemon=True
        ).start()

    def before_run(self, run_context):
        coord = self._coord
        seq = watchdog.next_seq(self._counter)
        if watchdog.arm_session_step(self._world, self._phase, self._detail, seq, lambda m: _stop_with(coord, m)):
            self._step = watchdog.session_step()

    def after_run(self, run_context, run_values):
        self._release()

    def end(self, session):
        self._release()

    def _release(self):
        step, self._step = self._step, None
        if step is not None:
            watchdog.release_session_step(step)

    def _release_at_close(self, coord) -> None:
        """A failed run skips ``after_run``: its session's close stops and joins the coordinator."""
        coord.wait_for_stop()
        while not coord.joined:
            time.sleep(_CLOSE_POLL_S)
        self._release()


def _stop_with(coord, message: str) -> None:
    """Hands the watchdog's error to the session's coordinator: the session's close raises it."""
    if coord is None:
        return
    try:
        raise CollectiveTimeoutError(message)
    except CollectiveTimeoutError:
        coord.request_stop(sys.exc_info())


def guard_steps(spec, graph: tf.Graph, mode):
    """``spec`` with a ``StepWatchdogHook`` when the steps of ``mode`` run collectives over Horovod ranks.

    Training steps on several ranks (a distributed world), and evaluation and prediction steps of a graph whose
    tables are sharded over the ranks. Nothing in one process.
    """
    from hybridtf._src.integrations.horovod_hooks import sharded_world

    world = sharded_world(graph)
    if world is None and mode == tf.estimator.ModeKeys.TRAIN:
        world = current_world()
    if spec is None or mode not in _PHASES or world is None or not world.distributed:
        return spec
    field = _HOOK_FIELDS[mode]
    hooks = tuple(getattr(spec, field, None) or ())
    if any(isinstance(h, StepWatchdogHook) for h in hooks):
        return spec
    hook = StepWatchdogHook(world, _PHASES[mode], f"Estimator {mode}")
    return spec._replace(**{field: (*hooks, hook)})

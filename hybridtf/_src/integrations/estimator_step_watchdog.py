"""An Estimator's steps under Horovod as armed collective phases of the watchdog (no rank waits forever).

A wrapped model_fn's training step on several ranks runs collectives (the
alltoall of tables sharded over the ranks, the allreduce of dense gradients),
and so do its evaluation and prediction steps when tables are sharded. When
the ranks' inputs differ in length, a rank whose input ended saves its last
checkpoint (or evaluates, or leaves) while the others wait in their next step.

TensorFlow's Estimator loop calls ``MonitoredSession.run``, which hybridtf
cannot wrap; a SessionRunHook's ``before_run`` / ``after_run`` come around the
run but do not see its exception. So ``StepWatchdogHook`` wraps the ``run``
method of its own session object (an instance attribute, given to
``after_create_session``), and ``before_run`` marks the next run on that
thread as the step: that run executes inside ``watchdog.collective_phase``, as
a Keras step function does. Past ``HYBRIDTF_COLLECTIVE_TIMEOUT_S`` the watchdog
prints its diagnosis and shuts Horovod down; the run then raises
``CollectiveTimeoutError``, and a run that fails because another rank shut
Horovod down raises ``CollectiveAbortedError`` naming this rank's step. The
other runs of the session (checkpoint saves, other hooks' fetches) pass
through unarmed.
"""

from __future__ import annotations

import functools
import threading

import tensorflow as tf

from hybridtf._src.distribute import watchdog
from hybridtf._src.distribute.world import current_world

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


class StepWatchdogHook(tf.compat.v1.train.SessionRunHook):
    """Runs each step's ``Session.run`` inside the watchdog's collective phase (see the module docstring)."""

    def __init__(self, world, phase: str, detail: str):
        self._world = world
        self._phase = phase
        self._detail = detail
        self._counter = f"estimator-step.{id(self)}"
        self._next = threading.local()  # set by before_run: the thread's next run of the session is the step

    def after_create_session(self, session, coord):
        run = session.run
        if getattr(run, "_htf_step_watchdog", None) is self:
            return

        @functools.wraps(run)
        def guarded(*args, **kwargs):
            if not getattr(self._next, "step", False):
                return run(*args, **kwargs)
            self._next.step = False
            seq = watchdog.next_seq(self._counter)
            with watchdog.collective_phase(self._world, self._phase, self._detail, seq, seq == 1, session_step=True):
                return run(*args, **kwargs)

        guarded._htf_step_watchdog = self
        session.run = guarded  # this session object only (the Estimator makes one per train/evaluate/predict)

    def before_run(self, run_context):
        self._next.step = True

    def after_run(self, run_context, run_values):
        self._next.step = False


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

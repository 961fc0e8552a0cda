"""The end of an Estimator's input under Adam: the dynamic tables' moments decay as the plain model_fn's do.

A ``train`` call whose input runs out (``steps=None`` over finite data) ends
with a step that fails in ``IteratorGetNext``. TensorFlow still runs that
step's ops that need no data, among them the start of TF1 Adam's sparse
update, ``m = m * beta1`` and ``v = v * beta2`` over the whole variable: in the
plain model_fn every embedding table's moments decay once more, and the
final checkpoint holds that. A dynamic (HybridHash) table's fused Adam
update needs the gradient, so it does not run.

``note_adam`` (called where the hooked TF1 optimizer builds a table's Adam
update) adds the table's ``HybridHashDecayAdamMoments`` op to a graph
collection; the op is not part of the train op. ``EndOfDataHook`` (added to
the TRAIN spec's hooks when that collection is not empty) knows the global
step after the last step that completed, and whether a step began and never
completed. The Estimator's last checkpoint of a ``train`` call is written by
its ``CheckpointSaverHook.end``, which runs before any model_fn hook's
``end``; so hybridtf's Saver (``CrashSafeSaver.save``) calls ``before_save``:
when the save is for the step after which a step failed, the decay runs
first, once. Periodic saves (a completed step) and a ``train`` call stopped by
its step count (nothing failed) change nothing; nor does a call whose input
was empty from the start, whose end writes no checkpoint (the same global
step was saved when its session started), as in the plain model_fn.
"""

from __future__ import annotations

import tensorflow as tf

DECAY_OPS = "hybridtf_end_of_data_decay"
HOOKS = "hybridtf_end_of_data_hooks"


def note_adam(table, one_minus_beta1, one_minus_beta2) -> None:
    """Records, in a TF1 graph, the data-free decay of ``table``'s Adam moments (run by ``before_save``)."""
    if tf.compat.v1.executing_eagerly_outside_functions():
        return  # TF2 (Keras fit, tf.function): keras_end_of_data covers the optimized Keras models
    tf.compat.v1.add_to_collection(DECAY_OPS, table.decay_adam_moments(one_minus_beta1, one_minus_beta2))


def has_decays(graph: tf.Graph) -> bool:
    return bool(graph.get_collection(DECAY_OPS))


class EndOfDataHook(tf.compat.v1.train.SessionRunHook):
    """Tracks the last completed step of a ``train`` call, for ``before_save`` (see the module docstring).

    ``step_after`` reads the global step after the train op (a control
    dependency), so each step's value arrives with the step's own fetches: no
    extra ``session.run`` per step.
    """

    def __init__(self, step_after=None):
        self._step_after = step_after

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._ops = graph.get_collection(DECAY_OPS)
        self._global_step = tf.compat.v1.train.get_global_step()
        self._open = False
        self._last = None
        self._applied = False
        if self not in graph.get_collection(HOOKS):
            graph.add_to_collection(HOOKS, self)

    def after_create_session(self, session, coord):
        self._last = int(session.run(self._global_step)) if self._global_step is not None else None

    def before_run(self, run_context):
        self._open = True
        return tf.compat.v1.train.SessionRunArgs(self._step_after) if self._step_after is not None else None

    def after_run(self, run_context, run_values):
        self._open = False
        if self._step_after is not None:
            self._last = int(run_values.results)

    def apply_if_ended(self, session, global_step) -> None:
        """Runs the decay when a step failed after the step ``global_step`` is being saved for."""
        if not self._open or self._applied or self._last is None or global_step is None:
            return
        if int(global_step) == self._last:
            session.run(self._ops)
            self._applied = True


def before_save(session, global_step) -> None:
    """Called by hybridtf's Saver before it writes a checkpoint of ``session``'s graph."""
    for hook in session.graph.get_collection(HOOKS):
        hook.apply_if_ended(session, global_step)


def with_hook(spec, graph: tf.Graph, mode):
    """``spec`` with an ``EndOfDataHook`` in its training hooks when ``graph`` has dynamic Adam tables (TRAIN)."""
    if mode != tf.estimator.ModeKeys.TRAIN or not has_decays(graph):
        return spec
    global_step = tf.compat.v1.train.get_global_step(graph)
    step_after = None
    if global_step is not None:  # a TRAIN spec always has its train op
        with graph.as_default(), tf.control_dependencies([spec.train_op]):
            step_after = tf.identity(global_step.read_value(), name="hybridtf_global_step_after_train_op")
    return spec._replace(training_hooks=(*spec.training_hooks, EndOfDataHook(step_after)))

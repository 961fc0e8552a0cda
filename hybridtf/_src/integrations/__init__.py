"""Integrations: how the capture -> plan -> rewrite -> run pipeline plugs into the user's training code.

Keras (``hybridtf.keras``):

* ``keras_model``: ``optimize``, the per-instance rewrite of a built Keras model; its steps
  (capture, plan, storage, hooks) are the functions of ``keras_optimize_steps``.
* ``keras_record``: the record pass that finds the lookups of the model's forward pass.
* ``keras_optimizers``: fused updates of packed tables, LazyAdam.
* ``keras_slots``: optimizer state saved and restored in the plain model's layout.
* ``keras_interleave``: micro-batched steps and K-interleaving groups for optimized models.

Custom loops: ``function`` (``hybridtf.function``, every lookup of a step packed).

Estimator (``hybridtf.estimator``): ``estimator`` (the model_fn wrapper), ``estimator_capture``,
``estimator_graph``, ``estimator_hooks`` (SessionRunHooks and graph statistics),
``estimator_saver`` and ``estimator_warm_start`` (checkpoints in the plain model_fn's layout).

Horovod: ``horovod_hooks`` (what hybridtf adds to Horovod's Keras and custom-loop tools).
Checkpoints: ``atomic_checkpoint`` (crash-safe writes).
"""

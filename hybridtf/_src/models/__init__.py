"""Example CTR models and their synthetic data, public as ``hybridtf.models``.

* ``ctr_data``: field specs (``FieldSpec``), the Criteo-like, 200-field and DIN field sets, and
  deterministic synthetic batches (numpy, tensors, ``tf.data``). TensorFlow-free at import.
* ``layers``: the plain Keras layers the models share (wide sum, multi-hot pooling, FM, DLRM dot
  interaction, DIN attention).
* ``ctr_models``: Wide & Deep, DeepFM, DLRM and DIN-style builders (functional, plus subclassed
  W&D and DLRM), the unchanged user code that ``hybridtf.keras.optimize`` wraps.
* ``examples``: the built-in configurations by short name (``wdl``/``deepfm``/``dlrm``/``din`` on
  ``criteo``/``f200``) that the report command, the demos and the benchmarks share.
"""

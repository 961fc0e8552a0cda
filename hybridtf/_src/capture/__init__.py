"""Capture stage: finds the user's embedding lookups and routes them to the packed chains.

* ``keras_capture``: the ``tf.keras.layers.Embedding`` layers of one model instance that can be
  packed, and those that cannot (``SkippedLayer`` with the reason).
* ``context``: the record / replay context through which captured lookups reach the rewrite.
* ``lookup_api``: the functional lookup API (``hybridtf.embedding``) and the id handling every
  lookup shares.
* ``layers``: hybridtf's Keras layers (``EmbeddingBag``: multi-hot ids pooled by sum/mean/sqrtn).
* ``regularizers``: which embeddings regularizers hybridtf reproduces exactly.
* ``subclassing``: per-instance behaviour through run-time subclasses, no global patching.
"""

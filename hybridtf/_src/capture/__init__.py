"""Capture stage: turns the user's embedding lookups into hybridtf lookup ops.

Filled by the packing issue: per-instance capture of ``tf.keras.layers.Embedding``
lookups, hybridtf's multi-hot layers, and the functional lookup API. See
docs/architecture.md.
"""

"""hybridtf's Keras layers.

``EmbeddingBag`` pools the embeddings of multi-hot ids (ragged, sparse or dense
``[batch, L]``) with ``"sum" | "mean" | "sqrtn"``; ``hybridtf.keras.optimize``
packs its table with the model's other embedding tables.

Example:
    >>> import hybridtf as htf
    >>> ids = tf.keras.Input(shape=(None,), ragged=True, dtype=tf.int64)
    >>> pooled = htf.layers.EmbeddingBag(10_000, 16, combiner="mean")(ids)
"""

from hybridtf._src.capture.layers import EmbeddingBag

__all__ = ["EmbeddingBag"]

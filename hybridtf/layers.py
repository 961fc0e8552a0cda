"""hybridtf's Keras layers.

``DynamicEmbedding`` stores any int64 id's row in a HybridHash table (hot/cold
tiers, no ``input_dim``); train it with ``hybridtf.keras.dynamic_optimizer``.

``EmbeddingBag`` pools the embeddings of multi-hot ids (ragged, sparse or dense
``[batch, L]``) with ``"sum" | "mean" | "sqrtn"``; ``hybridtf.keras.optimize``
packs its table with the model's other embedding tables.

Example:
    >>> import hybridtf as htf
    >>> ids = tf.keras.Input(shape=(None,), ragged=True, dtype=tf.int64)
    >>> pooled = htf.layers.EmbeddingBag(10_000, 16, combiner="mean")(ids)
"""

from hybridtf._src.caching.layer import DynamicEmbedding
from hybridtf._src.capture.layers import EmbeddingBag

__all__ = ["DynamicEmbedding", "EmbeddingBag"]

"""Caching: HybridHash dynamic embedding tables (PICASSO §III-D, Algorithm 1).

* ``table``: ``HybridHashTable``, the TF resource (hot/cold tiers, any int64
  id) with its checkpoint hooks, over the ``HybridTF>HybridHash*`` ops
  (kernels/hybrid_hash).
* ``layer``: ``DynamicEmbedding``, the Keras layer (no ``input_dim``).
* ``optimizer``: routes a DynamicEmbedding's gradient to the table's fused
  update with the table's own optimizer slots.
* ``metrics``: hit ratio, size, inserts and evictions in the Keras logs.
"""

"""Caching: HybridHash dynamic embedding tables (PICASSO §III-D, Algorithm 1).

* ``table``: ``HybridHashTable``, the TF resource (hot/cold tiers, any int64
  id) with its checkpoint hooks, over the ``HybridTF>HybridHash*`` ops
  (kernels/hybrid_hash).
* ``layer``: ``DynamicEmbedding``, the Keras layer (no ``input_dim``).
* ``optimizer``: routes a DynamicEmbedding's gradient to the table's fused
  update with the table's own optimizer slots.
* ``metrics``: hit ratio, size, inserts and evictions in the Keras logs.
* ``dynamic_table``: ``DynamicTableConfig`` / ``DynamicTable``, dynamic tables
  of the functional ``Tables`` API.
* ``v1_optimizer``: the same optimizer hook for ``tf.compat.v1.train``
  optimizers (Estimator model_fns).
* ``stats``: the reported metrics (hit ratios, sizes, inserts, evictions).
* ``fills``: the tables' step buffers over the micro-batches of one step.
"""

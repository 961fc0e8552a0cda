"""Rewrite stage: captured lookups, and what consumes them, turned into packed, fused op chains.

The rewrites happen while a training step is traced (the capture context records the step's
lookups, then replays them from the packed chains; op callbacks see the consumers' ops as they are
created). There is no pass over a finished GraphDef, no pass registry and no graph verifier: the
exactness tests (``tests/integration``) run every rewrite against the un-rewritten model.

Packing (PICASSO §III-B):

* ``packed_storage``: the packed variables, and the per-table views that keep checkpoints per table.
* ``lookup_chain``: the chain that replaces N lookups of one packed table
  (PackIds -> UniquePartition -> gather -> StitchCombine; under Horovod with the alltoalls).
* ``runtime``: runs a step's captured lookups with one chain per packed table (chains that read
  the same ids share one UniquePartition through UniqueSubset).
* ``regularization``: embeddings regularizers of packed tables, the same penalty and gradient.

Fusion of the consumers, matched on the dataflow, not on layer classes:

* ``dataflow_fusion``: a concatenation or sum of packed outputs -> StitchConcat, its matrix
  product -> StitchConcatMatMul.
* ``concat_fusion``: the column layouts one StitchConcat computes.
* ``attention_fusion``: DIN's attention input ``[q, k, q - k, q * k] @ W`` from the query once per
  example (no repeated query, no 4d-wide concatenation).

Interleaving (PICASSO §III-C):

* ``interleave``: K-interleaving, control dependencies between groups of chains (Eq. 3).
* ``micro_batch``, ``micro_batch_split``: D-interleaving, a step over N micro-batches with one
  update (Eq. 2), from the embedding layer or from a named layer.
* ``warmup``: the warm-up measurements Eq. 2 and Eq. 3 are fed with.

Caching (HybridHash, §III-D) has its own package, ``hybridtf._src.caching``.
"""

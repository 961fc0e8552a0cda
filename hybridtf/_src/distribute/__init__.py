"""Hybrid parallelism with Horovod: who owns which rows, and the exchanges between ranks.

* ``world``: the Horovod job hybridtf runs in (rank, size), or one process.
* ``layout``: where the rows of a packed table live on ``size`` ranks.
* ``exchange``: the model-parallel row exchange of a packed lookup (alltoall
  of ids, local gather, alltoall of rows) and the cross-rank agreement on
  invalid ids.
* ``dynamic_exchange``: dynamic (HybridHash) tables sharded by id (owner
  hash, alltoall of ids and rows, gradients summed at the owners, whole-table
  checkpoints).
* ``gradients``: the data-parallel side (allreduce of dense gradients) and
  the scaling of model-parallel gradients.
* ``watchdog``: bounded waits in collective phases; ranks that diverge end
  with an error naming where each rank was, instead of hanging.
"""

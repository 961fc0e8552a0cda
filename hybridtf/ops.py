"""hybridtf's fused TensorFlow ops (public API).

Every op validates its inputs and attributes and raises a clear error
(``tf.errors.InvalidArgumentError`` at run time, ``ValueError`` /
``TypeError`` when building) instead of crashing, hanging or returning a wrong
result; tools/fuzz_ops.py checks that (see docs/reliability.md).

Example:
    >>> import hybridtf as htf
    >>> r = htf.ops.unique_partition(tf.constant([5, 3, 5, 8]), num_partitions=2)
"""

from hybridtf._src.plan.sharding import even_range_bounds
from hybridtf._src.run.pack_ids import pack_ids
from hybridtf._src.run.results import UniquePartitionResult
from hybridtf._src.run.sparse_apply import sparse_apply_adagrad, sparse_apply_adam, sparse_apply_sgd
from hybridtf._src.run.stitch_combine import stitch_combine
from hybridtf._src.run.stitch_concat import StitchGroup, stitch_concat, stitch_concat_matmul
from hybridtf._src.run.unique_partition import stock_tf_unique_partition, unique_partition
from hybridtf._src.run.unique_subset import unique_subset

__all__ = [
    "StitchGroup",
    "UniquePartitionResult",
    "even_range_bounds",
    "pack_ids",
    "sparse_apply_adagrad",
    "sparse_apply_adam",
    "sparse_apply_sgd",
    "stitch_combine",
    "stitch_concat",
    "stitch_concat_matmul",
    "stock_tf_unique_partition",
    "unique_partition",
    "unique_subset",
]

"""hybridtf's fused TensorFlow ops (public API).

Example:
    >>> import hybridtf as htf
    >>> r = htf.ops.unique_partition(tf.constant([5, 3, 5, 8]), num_partitions=2)
"""

from hybridtf._src.plan.sharding import even_range_bounds
from hybridtf._src.run.results import UniquePartitionResult
from hybridtf._src.run.stitch_combine import stitch_combine
from hybridtf._src.run.unique_partition import stock_tf_unique_partition, unique_partition

__all__ = [
    "UniquePartitionResult",
    "even_range_bounds",
    "stitch_combine",
    "stock_tf_unique_partition",
    "unique_partition",
]

"""Result types shared by the TensorFlow ops and the NumPy (pybind11) binding."""

from __future__ import annotations

from typing import Any, NamedTuple


class UniquePartitionResult(NamedTuple):
    """Outputs of ``unique_partition``.

    Attributes:
        unique_ids: 1-D, every distinct id once, grouped by partition in
            ascending partition order; inside a partition in order of first
            occurrence in the input.
        partition_sizes: int32 ``[num_partitions]``, distinct ids per partition
            (the alltoall split sizes).
        inverse: same length as the input; ``unique_ids[inverse] == ids``.
    """

    unique_ids: Any
    partition_sizes: Any
    inverse: Any

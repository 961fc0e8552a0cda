"""Where the rows of a packed table live when it is sharded over the ranks of a job.

Rows of a packed table are numbered ``[0, num_rows)`` (its members' row ranges
side by side). With ``size`` ranks:

* ``"mod"``: row ``r`` lives on rank ``r % size`` as local row ``r // size``
  (hot low ids of every table are spread over all ranks);
* ``"range"``: rank ``k`` holds the contiguous rows
  ``[bounds[k], bounds[k + 1])`` of ``even_range_bounds(num_rows, size)``.

Under both strategies the rows of one member table that a rank holds are
consecutive local rows (``Segment``), so a table's rows are read and
restored with one slice per rank.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybridtf._src.plan.sharding import check_strategy, even_range_bounds


@dataclasses.dataclass(frozen=True)
class Segment:
    """The rows of a member range that one rank holds.

    Member rows ``member_start, member_start + stride, ...`` (``count`` of
    them, relative to the member's first row) are local rows
    ``local_start, local_start + 1, ...`` of that rank's shard.
    """

    local_start: int
    count: int
    member_start: int
    stride: int


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """The sharding of one packed table of ``num_rows`` rows over ``size`` ranks.

    Example:
        >>> layout = ShardLayout(10, 3, "mod")
        >>> [layout.local_rows(k) for k in range(3)], layout.segment(1, 4, 2)
        ([4, 3, 3], Segment(local_start=0, count=1, member_start=1, stride=3))
    """

    num_rows: int
    size: int
    strategy: str = "mod"

    def __post_init__(self):
        check_strategy(self.strategy)
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}.")

    @property
    def bounds(self) -> np.ndarray:
        return even_range_bounds(self.num_rows, self.size)

    def local_rows(self, rank: int) -> int:
        """Rows of the shard on ``rank``."""
        if self.strategy == "mod":
            return max(0, (self.num_rows - rank + self.size - 1) // self.size)
        b = self.bounds
        return int(b[rank + 1] - b[rank])

    def segment(self, offset: int, count: int, rank: int) -> Segment:
        """The rows of member range ``[offset, offset + count)`` held by ``rank``."""
        if self.strategy == "mod":
            first = offset + (rank - offset) % self.size
            n = 0 if first >= offset + count else (offset + count - 1 - first) // self.size + 1
            return Segment(first // self.size, n, first - offset, self.size)
        b = self.bounds
        lo, hi = max(offset, int(b[rank])), min(offset + count, int(b[rank + 1]))
        n = max(0, hi - lo)
        return Segment(lo - int(b[rank]) if n else 0, n, lo - offset if n else 0, 1)

    def local_slice(self, offset: int, count: int, rank: int) -> slice:
        """The local rows of ``rank``'s shard that hold rows of member range ``[offset, offset + count)``."""
        seg = self.segment(offset, count, rank)
        return slice(seg.local_start, seg.local_start + seg.count)

    def own_rows(self, value, offset: int, count: int, rank: int):
        """``rank``'s rows of a member's whole ``value`` (``[count, ...]``, array or tensor), in local order."""
        seg = self.segment(offset, count, rank)
        return value[seg.member_start :: seg.stride][: seg.count]

    def gather_order(self, offset: int, count: int) -> np.ndarray:
        """For the rank-ordered concatenation of every rank's segment: the member row of each position."""
        parts = []
        for rank in range(self.size):
            s = self.segment(offset, count, rank)
            parts.append(s.member_start + s.stride * np.arange(s.count, dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros([0], np.int64)

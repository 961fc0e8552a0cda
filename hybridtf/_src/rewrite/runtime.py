"""Runs captured lookups with one packed chain per packed table."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.capture.context import LookupRequest
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.lookup_chain import packed_lookup
from hybridtf._src.rewrite.packed_storage import PackedTables


class PackedRuntime:
    """Maps lookup requests to packed tables and runs their chains.

    Args:
        plan: the packing plan.
        storage: the packed variables of that plan.
    """

    def __init__(self, plan: PackingPlan, storage: PackedTables):
        self.plan = plan
        self.storage = storage
        self._order = [pt.name for pt in plan.packed_tables]

    def lookup(self, requests: Sequence[LookupRequest]) -> list[tf.Tensor]:
        """One output per request, computed with one chain per packed table."""
        by_table: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            packed_name, _ = self.plan.location(req.table)
            by_table.setdefault(packed_name, []).append(i)
        outputs: list[tf.Tensor | None] = [None] * len(requests)
        for packed_name in self._order:
            indices = by_table.get(packed_name)
            if not indices:
                continue
            results = packed_lookup(
                self.storage.packed[packed_name],
                self.storage.members(packed_name),
                [requests[i] for i in indices],
                name=packed_name,
            )
            for i, out in zip(indices, results):
                outputs[i] = out
        return outputs

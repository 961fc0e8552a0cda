"""Runs captured lookups with one packed chain per packed table."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError, LookupRequest
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


def runtime_of(request: LookupRequest):
    """The runtime that computes ``request``: the ``_htf_runtime`` of the object that issued it.

    Captured Keras layers carry their optimized model's ``PackedRuntime``,
    ``hybridtf.embedding.Tables`` their own runtime.

    Raises:
        CaptureError: the issuing object has no runtime.

    Example:
        >>> runtime_of(LookupRequest("user", ids, owner=tables)) is tables._htf_runtime
        True
    """
    runtime = getattr(request.owner, "_htf_runtime", None)
    if runtime is None:
        raise CaptureError(
            f"the lookup of table {request.table!r} was issued by a {type(request.owner).__name__}, which has no "
            "hybridtf runtime; only optimized Keras models' layers and hybridtf.embedding.Tables record lookups."
        )
    return runtime


def lookup_all(requests) -> list:
    """Computes recorded lookups: the requests of each runtime together (one chain per packed table).

    Args:
        requests: ``LookupRequest``s from any number of runtimes.

    Returns:
        One output per request, in order.

    Example:
        >>> outs = lookup_all([LookupRequest("user", u, owner=tables), LookupRequest("item", i, "mean", tables)])
    """
    groups: dict[int, tuple[object, list[int]]] = {}
    for i, request in enumerate(requests):
        runtime = runtime_of(request)
        groups.setdefault(id(runtime), (runtime, []))[1].append(i)
    outputs: list = [None] * len(requests)
    for runtime, indices in groups.values():
        for i, out in zip(indices, runtime.lookup([requests[i] for i in indices])):
            outputs[i] = out
    return outputs

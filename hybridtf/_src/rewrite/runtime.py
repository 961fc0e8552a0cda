"""Runs captured lookups with one packed chain per packed table."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError, LookupRequest
from hybridtf._src.distribute import exchange
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.lookup_chain import pack_requests, packed_lookup, stitch_outputs
from hybridtf._src.rewrite.packed_storage import PackedTables
from hybridtf._src.run.unique_partition import unique_partition


class PackedRuntime:
    """Maps lookup requests to packed tables and runs their chains.

    In a Horovod job whose storage shards tables, every step first agrees
    across ranks that all ids are valid (one small allreduce), then runs the
    model-parallel chain of each sharded table (UniquePartition by owner ->
    alltoall ids -> local gather -> alltoall rows -> StitchCombine);
    replicated tables run the one-process chain.

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
        if self.storage.world.distributed:
            self._distributed_lookup(requests, by_table, outputs)
            return outputs
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

    def _distributed_lookup(self, requests, by_table, outputs) -> None:
        world = self.storage.world
        names = [n for n in self._order if by_table.get(n)]
        prepared = {}
        for name in names:
            with tf.name_scope(name):
                prepared[name] = pack_requests(
                    self.storage.members(name), [requests[i] for i in by_table[name]], on_invalid="count"
                )
        check = exchange.agree_on_valid_ids(
            world, [prepared[n].invalid for n in names], [v for n in names for v in prepared[n].vocabularies]
        )
        with tf.control_dependencies([check] if check is not None else []):
            for name in names:
                with tf.name_scope(name):
                    variable, layout = self.storage.packed[name], self.storage.layouts[name]
                    if layout is None:  # replicated: every row is here
                        unique = unique_partition(prepared[name].packed, 1, sort_ids=True)
                        rows = tf.gather(variable, unique.unique_ids)
                    else:
                        unique = exchange.partition_ids(prepared[name].packed, layout)
                        rows = exchange.exchange_rows(variable, unique, layout, world, f"hybridtf_{name}")
                    results = stitch_outputs(prepared[name], rows, unique.inverse, variable.shape[-1])
                for i, out in zip(by_table[name], results):
                    outputs[i] = out


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

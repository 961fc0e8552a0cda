"""Runs captured lookups with one packed chain per packed table."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import tensorflow as tf

from hybridtf._src.capture.context import CaptureError, LookupRequest
from hybridtf._src.distribute import exchange
from hybridtf._src.plan.interleaving import InterleavingPlan
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.interleave import GroupOrder, same_group
from hybridtf._src.rewrite.lookup_chain import (
    UniqueSource,
    derived_requests,
    own_unique,
    pack_requests,
    positions_key,
    stitch_outputs,
)
from hybridtf._src.rewrite.packed_storage import PackedTables
from hybridtf._src.run.gather_rows import gather_variable_rows


class PackedRuntime:
    """Maps lookup requests to packed tables and runs their chains.

    In a Horovod job whose storage shards tables, every step first agrees
    across ranks that all ids are valid (one small allreduce), then runs the
    model-parallel chain of each sharded table (UniquePartition by owner ->
    alltoall ids -> local gather -> alltoall rows -> StitchCombine);
    replicated tables run the one-process chain. With an ``interleaving``
    plan, each chain stage of a K-interleaving group depends on the same stage
    of the previous group (``rewrite/interleave.py``).

    Args:
        plan: the packing plan.
        storage: the packed variables of that plan.
    """

    def __init__(self, plan: PackingPlan, storage: PackedTables, share_unique: bool = True):
        self.plan = plan
        self.storage = storage
        self.share_unique = bool(share_unique)
        self._order = [pt.name for pt in plan.packed_tables]
        # packed table -> the packed table whose UniquePartition it reused, at the last trace.
        self.shared_uniques: dict[str, str] = {}
        # K-interleaving groups (control dependencies between groups' chain stages); None: off.
        self.interleaving: InterleavingPlan | None = None

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
        names = [n for n in self._order if by_table.get(n)]
        table_requests = {n: [requests[i] for i in by_table[n]] for n in names}
        sources = self._unique_sources(table_requests) if self.share_unique else {}
        sources = {n: s for n, s in sources.items() if same_group(self.interleaving, n, s.source)}
        self.shared_uniques = {n: src.source for n, src in sources.items()}
        order = GroupOrder(self.interleaving)
        chains = {}  # packed table -> (prepared requests, unique result), for the tables others reuse
        for name in sorted(order.order(names), key=lambda n: (order.group(n) or 0, n in sources)):
            variable, members = self.storage.packed[name], self.storage.members(name)
            with tf.name_scope(name):
                if name in sources:
                    src = sources[name]
                    with order.stage(name, "unique"):
                        prepared, unique = derived_requests(
                            members,
                            table_requests[name],
                            self.storage.members(src.source),
                            table_requests[src.source],
                            *chains[src.source],
                            src.fields,
                        )
                else:
                    with order.stage(name, "pack"):
                        prepared = pack_requests(members, table_requests[name])
                    order.done(name, "pack", prepared.packed)
                    with order.stage(name, "unique"):
                        unique = own_unique(prepared)
                    chains[name] = (prepared, unique)
                order.done(name, "unique", unique)
                with order.stage(name, "exchange"):  # one process: the gather
                    rows = gather_variable_rows(variable, unique.unique_ids)
                order.done(name, "exchange", rows)
                results = stitch_outputs(prepared, rows, unique.inverse, variable.shape[-1])
            for i, out in zip(by_table[name], results):
                outputs[i] = out
        norms = getattr(self.storage, "gradient_norms", None)  # exact clipping (rewrite/gradient_norms.py)
        if norms is not None:
            outputs = [norms.track(req, out) for req, out in zip(requests, outputs)]
        return outputs

    def _unique_sources(self, table_requests: dict[str, list[LookupRequest]]) -> dict[str, UniqueSource]:
        """Packed tables whose lookups all use ids another table's chain already deduplicates.

        Wide & Deep looks up each feature's ids in a wide (dim 1) and a deep
        table: the deep packed tables then take their unique ids and inverse
        from the wide chain (``unique_subset``) instead of deduplicating the
        same ids again. A table qualifies when each of its lookups names a
        different member table and has the same ids (the same tensor) and
        vocabulary size as a lookup of the source whose member table the
        source looks up only once; a source computes its own chain.
        """

        keys = {}  # packed table -> per request (positions key, rows of its member table)
        for name, reqs in table_requests.items():
            members = self.storage.members(name)
            keys[name] = [(positions_key(r.ids), members[r.table][1]) for r in reqs]
        index = {}  # packed table -> {(positions key, rows): first request index}
        for name, reqs in table_requests.items():
            index[name] = {}
            uses = collections.Counter(r.table for r in reqs)
            for i, key in enumerate(keys[name]):
                # a member table looked up twice shares its segment of unique ids: not a source
                if key[0] is not None and uses[reqs[i].table] == 1:
                    index[name].setdefault(key, i)
        sources: dict[str, UniqueSource] = {}
        by_size = sorted(table_requests, key=lambda n: -len(table_requests[n]))
        for name in reversed(by_size):  # the largest tables are the likeliest sources
            reqs = table_requests[name]
            if len({r.table for r in reqs}) != len(reqs):
                continue  # a member looked up twice: its rows would repeat in a derived unique list
            wanted = keys[name]
            for candidate in by_size:
                if candidate == name or candidate in sources:
                    continue
                if all(key in index[candidate] for key in wanted):
                    sources[name] = UniqueSource(candidate, [index[candidate][key] for key in wanted])
                    break
        # a source must compute its own chain: drop derivations from derived tables
        for name in list(sources):
            if sources[name].source in sources:
                del sources[name]
        return sources

    def _distributed_lookup(self, requests, by_table, outputs) -> None:
        world = self.storage.world
        order = GroupOrder(self.interleaving)
        names = order.order([n for n in self._order if by_table.get(n)])
        prepared = {}
        for name in names:
            with tf.name_scope(name), order.stage(name, "pack"):
                prepared[name] = pack_requests(
                    self.storage.members(name), [requests[i] for i in by_table[name]], on_invalid="count"
                )
            order.done(name, "pack", prepared[name].packed)
        check = exchange.agree_on_valid_ids(
            world, [prepared[n].invalid for n in names], [v for n in names for v in prepared[n].vocabularies]
        )
        with tf.control_dependencies([check] if check is not None else []):
            for name in names:
                with tf.name_scope(name):
                    variable, layout = self.storage.packed[name], self.storage.layouts[name]
                    if layout is None:  # replicated: every row is here
                        with order.stage(name, "unique"):
                            unique = own_unique(prepared[name])
                        order.done(name, "unique", unique)
                        with order.stage(name, "exchange"):
                            rows = gather_variable_rows(variable, unique.unique_ids)
                    else:
                        with order.stage(name, "unique"):
                            unique = exchange.partition_ids(prepared[name].packed, layout)
                        order.done(name, "unique", unique)
                        with order.stage(name, "exchange"):
                            rows = exchange.exchange_rows(variable, unique, layout, world, f"hybridtf_{name}")
                    order.done(name, "exchange", rows)
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

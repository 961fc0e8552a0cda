"""Warm-up id statistics and PICASSO's CalcVParam (Eq. 1).

PICASSO (§III.B) estimates the execution cost of a packed operation by the
parameter volume (number of floats) it moves, from ID statistics of warm-up
iterations::

    CalcVParam(T) = N * sum_{t in T} ( t_dim * sum_{ID in t} ID_freq )        (Eq. 1)

with ``N`` the total number of categorical feature IDs, ``T`` a packed
embedding table, ``t_dim`` the dimension of its member table ``t`` and
``ID_freq`` the frequency of an ID. ``collect_stats`` measures the warm-up
quantities, ``id_frequencies`` turns them (or, without statistics, a uniform
access assumption) into ``N`` and ``sum_{ID in t} ID_freq``, and
``calc_vparam`` evaluates Eq. 1. TensorFlow-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from hybridtf._src.plan.tables import TableSpec


@dataclass(frozen=True)
class TableStats:
    """Id statistics of one table over the warm-up batches.

    Attributes:
        steps: warm-up batches seen (a batch without this table counts as a
            step with no ids).
        ids_total: ids looked up over all steps (duplicates counted).
        distinct_total: distinct ids over the whole warm-up.
        distinct_per_step: mean distinct ids per step (what in-batch dedup,
            the fused Unique&Partition, leaves to fetch).
        max_id_count: occurrences of the most frequent id over the warm-up.

    Example:
        >>> s = TableStats(steps=2, ids_total=10, distinct_total=4, distinct_per_step=3.0, max_id_count=5)
        >>> s.ids_per_step, s.unique_ratio, s.hottest_share
        (5.0, 0.6, 0.5)
    """

    steps: int
    ids_total: int
    distinct_total: int
    distinct_per_step: float
    max_id_count: int

    @property
    def ids_per_step(self) -> float:
        """Mean ids looked up per step (the table's share of Eq. 1's ``N``)."""
        return self.ids_total / self.steps if self.steps else 0.0

    @property
    def unique_ratio(self) -> float:
        """Mean distinct ids per step over mean ids per step (1: no repeats; 0 when no ids)."""
        return self.distinct_per_step / self.ids_per_step if self.ids_total else 0.0

    @property
    def hottest_share(self) -> float:
        """Fraction of all lookups that hit the single most frequent id (a skew measure)."""
        return self.max_id_count / self.ids_total if self.ids_total else 0.0


def index_tables(tables: Iterable[TableSpec]) -> dict[str, TableSpec]:
    """Name -> spec in input order; raises ValueError on duplicate names or non-TableSpec items."""
    out: dict[str, TableSpec] = {}
    for t in tables:
        if not isinstance(t, TableSpec):
            raise TypeError(f"tables must hold TableSpec objects, got {type(t).__name__}: {t!r}.")
        if t.name in out:
            raise ValueError(
                f"duplicate table name {t.name!r}: every table needs a unique name. "
                "Rename one of the tables (names key the plan, checkpoints and statistics)."
            )
        out[t.name] = t
    return out


def _check_ids(name: str, ids, spec: TableSpec, step: int) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"warm-up batch {step}, table {name!r}: ids must be an integer array, got dtype {arr.dtype}. "
            "Pass the ids (hash string features into ids first)."
        )
    arr = arr.reshape(-1)
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi >= spec.num_rows:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"warm-up batch {step}, table {name!r}: id {int(bad)} is outside [0, {spec.num_rows}) "
                f"(num_rows of the table). Fix the ids or the table's num_rows; packed tables place the next "
                "table's rows right after this one's."
            )
    if arr.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        arr = arr.astype(np.int64)  # in range, so exact
    return arr


def _distinct_with_counts(ids: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids and how often each occurs (or the sum of its weights), with the fused dedup kernel."""
    from hybridtf import native

    r = native.unique_partition(ids, 1)
    counts = np.bincount(r.inverse, weights=weights, minlength=len(r.unique_ids))
    return r.unique_ids, counts.astype(np.int64)


def collect_stats(batches: Iterable[Mapping[str, np.ndarray]], tables: Iterable[TableSpec]) -> dict[str, TableStats]:
    """Measures per-table id statistics over warm-up batches.

    Each batch maps table names to that step's ids (any shape; multi-hot ids
    may be passed as the flat values of a ragged or sparse tensor). Dedup uses
    the same fused Unique&Partition algorithm as the kernels
    (``hybridtf.native.unique_partition`` with one partition).

    Args:
        batches: warm-up batches, ``{table name: integer ids}``. A table that is
            absent from a batch looked up no ids in that step.
        tables: the model's tables.

    Returns:
        ``{table name: TableStats}`` for every table that appears in at least
        one batch, in the order of ``tables``.

    Raises:
        ValueError: no batches, a batch key that is not a table, ids outside
            ``[0, num_rows)``, duplicate table names.
        TypeError: a batch is not a mapping, or ids are not integers.

    Example:
        >>> t = TableSpec("item", num_rows=10, dim=8)
        >>> s = collect_stats([{"item": np.array([1, 1, 2])}, {"item": np.array([3])}], [t])["item"]
        >>> s.ids_per_step, s.distinct_per_step, s.distinct_total
        (2.0, 1.5, 3)
    """
    specs = index_tables(tables)
    steps = 0
    uniques: dict[str, list[np.ndarray]] = {}
    counts: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        if not isinstance(batch, Mapping):
            raise TypeError(f"warm-up batch {steps} must be a mapping {{table name: ids}}, got {type(batch).__name__}.")
        for name, ids in batch.items():
            if name not in specs:
                raise ValueError(
                    f"warm-up batch {steps} has ids for {name!r}, which is not one of the tables "
                    f"({', '.join(sorted(specs))}). Pass only the embedding ids, keyed by table name."
                )
            arr = _check_ids(name, ids, specs[name], steps)
            u, c = _distinct_with_counts(arr)
            uniques.setdefault(name, []).append(u)
            counts.setdefault(name, []).append(c)
        steps += 1
    if steps == 0:
        raise ValueError("collect_stats needs at least one warm-up batch; got none.")
    out: dict[str, TableStats] = {}
    for name in specs:
        if name not in uniques:
            continue
        per_step_distinct = [len(u) for u in uniques[name]]
        step_counts = np.concatenate(counts[name])
        # Merge the per-step histograms into one over the warm-up.
        _, total_counts = _distinct_with_counts(np.concatenate(uniques[name]), step_counts.astype(np.float64))
        out[name] = TableStats(
            steps=steps,
            ids_total=int(step_counts.sum()),
            distinct_total=len(total_counts),
            distinct_per_step=float(sum(per_step_distinct)) / steps,
            max_id_count=int(total_counts.max()) if len(total_counts) else 0,
        )
    return out


@dataclass(frozen=True)
class IdFrequencies:
    """The warm-up quantities of Eq. 1.

    Attributes:
        n: ``N``, the total number of categorical feature IDs, over all
            tables: per step from warm-up statistics, per example under the
            uniform assumption.
        freq_sum: ``sum_{ID in t} ID_freq`` for every table ``t``, where
            ``ID_freq`` is the relative frequency of an ID among all ``N``
            (so the sums over all tables add up to 1).
        source: ``"warmup"`` or ``"uniform"``.
    """

    n: float
    freq_sum: Mapping[str, float]
    source: str


def id_frequencies(tables: Iterable[TableSpec], stats: Mapping[str, TableStats] | None = None) -> IdFrequencies:
    """``N`` and ``sum_{ID in t} ID_freq`` of Eq. 1 for every table.

    With ``stats``, ``N = sum_t ids_per_step(t)`` and an ID that occurred
    ``count`` times in ``steps`` warm-up steps has
    ``ID_freq = count / (steps * N)``, so ``sum_{ID in t} ID_freq =
    ids_per_step(t) / N`` (computed in that closed form instead of summing
    per-ID floats). Without ``stats`` access is uniform: each of table t's
    ``num_rows`` IDs has ``ID_freq = ids_per_sample(t) / (num_rows * N)`` with
    ``N = sum_t ids_per_sample(t)`` per example.

    Args:
        tables: the tables to evaluate.
        stats: warm-up statistics from ``collect_stats`` covering every table,
            or None for uniform access.

    Returns:
        ``IdFrequencies``.

    Raises:
        ValueError: ``stats`` misses some of the tables.

    Example:
        >>> f = id_frequencies([TableSpec("a", 10, 8), TableSpec("b", 10, 8, ids_per_sample=3.0)])
        >>> f.n, dict(f.freq_sum)
        (4.0, {'a': 0.25, 'b': 0.75})
    """
    tables = list(tables)
    if stats is None:
        per = {t.name: t.ids_per_sample for t in tables}
        source = "uniform"
    else:
        missing = [t.name for t in tables if t.name not in stats]
        if missing:
            raise ValueError(
                f"warm-up stats have no entry for table(s) {', '.join(map(repr, missing))}. Include their ids in "
                "the warm-up batches given to collect_stats, exclude the tables, or plan without stats (uniform)."
            )
        per = {t.name: stats[t.name].ids_per_step for t in tables}
        source = "warmup"
    n = float(sum(per.values()))  # N
    freq_sum = {name: (count / n if n > 0 else 0.0) for name, count in per.items()}  # sum_{ID in t} ID_freq
    return IdFrequencies(n=n, freq_sum=freq_sum, source=source)


def calc_vparam(packed: Iterable[TableSpec], freqs: IdFrequencies) -> float:
    """CalcVParam(T) of PICASSO Eq. 1 for the packed table ``T`` made of ``packed``.

    ``CalcVParam(T) = N * sum_{t in T} (t_dim * sum_{ID in t} ID_freq)``: the
    number of embedding floats ``T`` gathers per step (per example without
    warm-up statistics), before in-batch dedup.

    Args:
        packed: the member tables ``t`` of ``T``.
        freqs: ``N`` and the per-table frequency sums (``id_frequencies``).

    Returns:
        The value, a float >= 0.

    Example:
        >>> a, b = TableSpec("a", 10, 8), TableSpec("b", 10, 32)
        >>> calc_vparam([a, b], id_frequencies([a, b]))
        40.0
    """
    total = 0.0
    for t in packed:  # t in T
        if t.name not in freqs.freq_sum:
            raise ValueError(f"no ID frequencies for table {t.name!r}; build them with id_frequencies(all tables).")
        total += t.dim * freqs.freq_sum[t.name]  # t_dim * sum_{ID in t} ID_freq
    return freqs.n * total  # N * sum_{t in T}(...)

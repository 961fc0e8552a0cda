"""What a HybridHash table's statistics mean, in one place (Estimator StatsHook, ``hybridtf.report``).

``summarize`` turns the store's raw counters (``table.STAT_NAMES``) into the
metrics hybridtf reports everywhere:

* ``hit_ratio``: distinct ids of the last completed step served by the hot
  tier / distinct ids looked up in it (0 during warm-up: nothing is hot);
* ``hit_ratio_cumulative``: the same over every training lookup so far;
* ``occurrence_hit_ratio``: over id occurrences (a repeated id counts each time);
* ``size``, ``hot_used`` / ``hot_rows``, ``inserts``, ``evictions``,
  ``flushes``, ``step`` and ``bytes`` (cold + hot tiers).
"""

from __future__ import annotations

from collections.abc import Mapping

from hybridtf._src.caching.table import STAT_NAMES


def summarize(stats) -> dict:
    """The reported metrics of one table from its raw statistics (a dict, or a vector in ``STAT_NAMES`` order).

    Example:
        >>> summarize(table.stats())["hit_ratio_cumulative"]
        0.81
    """
    s = stats if isinstance(stats, Mapping) else dict(zip(STAT_NAMES, (int(v) for v in stats)))
    return {
        "hit_ratio": s["last_step_hits"] / max(s["last_step_lookups"], 1),
        "hit_ratio_cumulative": s["hits"] / max(s["lookups"], 1),
        "occurrence_hit_ratio": s["occurrence_hits"] / max(s["occurrences"], 1),
        "size": s["size"],
        "hot_used": s["hot_used"],
        "hot_rows": s["hot_rows"],
        "inserts": s["inserts"],
        "evictions": s["evictions"],
        "flushes": s["flushes"],
        "step": s["step"],
        "bytes": s["bytes"] + s["hot_bytes"],
    }


def format_line(name: str, summary: Mapping) -> str:
    """One log line for a table's ``summarize`` result.

    Example:
        >>> format_line("user", summarize(table.stats()))
        "hybridtf: dynamic table 'user': hit ratio 0.812 (cumulative 0.790), 1,024 rows, ..."
    """
    s = summary
    return (
        f"hybridtf: dynamic table {name!r}: hit ratio {s['hit_ratio']:.3f} (cumulative "
        f"{s['hit_ratio_cumulative']:.3f}), {s['size']:,} rows ({s['hot_used']:,}/{s['hot_rows']:,} hot), "
        f"{s['inserts']:,} inserts, {s['evictions']:,} evictions, {s['flushes']:,} flushes, step {s['step']:,}"
    )

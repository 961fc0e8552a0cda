"""CI slice of the op fuzzer (tools/fuzz_ops.py): every op on every path, fixed seed, bounded time.

Fails on any crash, hang, output that differs from the NumPy reference, invalid input accepted,
valid input rejected or unexpected exception; the findings (with reproducer files) are in the
assertion message. The full run (>= 10,000 cases per op and path) is documented in docs/reliability.md.
"""

from __future__ import annotations

import pytest

from tests.fuzz import runner
from tests.fuzz.registry import OPS

CASES = 100  # per op and path: every input class 14-25 times
SEED = 15


@pytest.mark.slow
def test_fuzz_slice(tmp_path):
    results = runner.run_fuzz(cases=CASES, seed=SEED, timeout=60.0, jobs=2, repro_dir=tmp_path, time_limit=170)
    table = runner.markdown(results)
    assert results.failures() == 0, f"{results.findings[:20]}\n{table}"
    streams = {(op, path) for op, spec in OPS.items() for path in spec.paths}
    # Time-bounded: on a heavily loaded machine the slice may stop early, but every stream must run.
    ran = {key for key, counts in results.counts.items() if sum(counts.values()) > 0}
    assert ran == streams, f"streams that ran no case within the time limit: {sorted(streams - ran)}\n{table}"
    assert sum(c["clean-error"] for c in results.counts.values()) > 0
    assert sum(c["ok-equal"] for c in results.counts.values()) > 0

"""Writes ``tests/slow_tests.txt``: the tests a ``--durations=0`` run measured at or above a threshold.

``./dev.sh test`` leaves the tests marked ``slow`` out (``./dev.sh test --slow`` runs only them,
``--all`` everything; CI runs both), so the everyday suite stays short. A test is ``slow`` when its
module marks it (``pytestmark = pytest.mark.slow``: modules whose expensive module fixture, such as
a ``horovodrun`` launch, is charged to their first test) or when it is listed in
``tests/slow_tests.txt``, which ``tests/conftest.py`` reads. Refresh the list after adding heavy
tests::

    ./dev.sh test --all --durations=0 > /tmp/durations.log
    .venv/bin/python tools/slow_tests.py /tmp/durations.log --threshold 8

A listed test that no longer exists is ignored; a renamed one is fast until the list is refreshed.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINE = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+(tests/\S.*?)\s*$")


def durations(log: str) -> dict[str, float]:
    """Seconds per test id (setup + call + teardown) from pytest's ``--durations`` report."""
    total: dict[str, float] = collections.Counter()
    for line in log.splitlines():
        match = LINE.match(line)
        if match:  # pytest-xdist's loadgroup scheduling appends "@<group>" to the ids it reports
            total[match.group(2).split("@")[0]] += float(match.group(1))
    return dict(total)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="output of a pytest run with --durations=0")
    parser.add_argument("--threshold", type=float, default=8.0, help="seconds (default 8)")
    parser.add_argument("--out", default=str(ROOT / "tests" / "slow_tests.txt"))
    args = parser.parse_args(argv)
    if args.threshold <= 0:
        parser.error(f"--threshold must be > 0 seconds, got {args.threshold}")
    measured = durations(pathlib.Path(args.log).read_text())
    if not measured:
        parser.error(f"{args.log}: no '--durations' lines found (run pytest with --durations=0)")
    slow = sorted(t for t, s in measured.items() if s >= args.threshold)
    header = (
        f"# Tests that took >= {args.threshold:g} s (setup + call + teardown) in a --durations=0 run;\n"
        "# written by tools/slow_tests.py, read by tests/conftest.py (marked slow: ./dev.sh test --slow).\n"
    )
    pathlib.Path(args.out).write_text(header + "".join(f"{t}\n" for t in slow))
    share = sum(measured[t] for t in slow) / sum(measured.values())
    print(f"{len(slow)} of {len(measured)} timed tests listed ({share:.0%} of the measured time) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

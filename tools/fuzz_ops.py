#!/usr/bin/env python
"""Fuzzes hybridtf's custom ops (raw op, Python wrapper, NumPy binding) against NumPy references.

Every case is valid (must equal the reference) or adversarial by construction (must raise
InvalidArgument / ValueError / TypeError); see tests/fuzz/cases.py. Cases run in worker processes,
so a crash (signal) or a hang (timeout) is counted, its reproducer saved, and the run goes on.

Usage:
    python tools/fuzz_ops.py --cases 10000                 # every op and path, 10,000 cases each
    python tools/fuzz_ops.py --ops StitchCombine --paths raw --cases 500 --seed 3
    python tools/fuzz_ops.py --replay build/fuzz-repro/StitchConcat-raw-seed0-case17.pkl

Prints a markdown table (cases per input class and per outcome for every op and path), writes
the same as JSON (--json), and exits 1 when any case crashed, hung, differed from the reference,
was accepted although invalid, was rejected although valid or raised an unexpected exception.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import pickle
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz import runner  # noqa: E402
from tests.fuzz.registry import OPS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=1000, help="cases per op and path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", nargs="*", choices=sorted(OPS), help=f"default: all {len(OPS)}")
    parser.add_argument("--paths", nargs="*", choices=("raw", "wrapper", "native"), help="default: all")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a case counts as a hang")
    parser.add_argument("--time-limit", type=float, default=None, help="stop starting cases after this many seconds")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here")
    parser.add_argument("--repro-dir", type=pathlib.Path, default=ROOT / "build" / "fuzz-repro")
    parser.add_argument("--replay", type=pathlib.Path, help="run one saved reproducer in this process")
    args = parser.parse_args(argv)

    if args.replay:
        from tests.fuzz.worker import run_case

        saved = pickle.loads(args.replay.read_bytes())
        case = saved["case"]
        print(f"{case.op} / {saved['path']}, class {case.cls}, valid={case.valid}", flush=True)
        print(run_case(case, saved["path"]))
        return 0

    start = time.monotonic()
    results = runner.run_fuzz(
        args.ops, args.paths, args.cases, args.seed, args.timeout, args.jobs, args.repro_dir, args.time_limit
    )
    print(runner.markdown(results))
    print(
        f"\n{sum(sum(c.values()) for c in results.counts.values())} cases in {time.monotonic() - start:.0f} s, "
        f"seed {args.seed}; {results.failures()} failures."
    )
    for f in results.findings[:30]:
        print(
            f"  {f['op']}/{f['path']} case {f['index']} ({f['cls']}): {f['outcome']} {f['detail']} "
            f"{f['reproducer'] or ''}"
        )
    if args.json:
        args.json.write_text(json.dumps(dict(seed=args.seed, cases=args.cases, **runner.to_json(results)), indent=1))
    return 1 if results.failures() else 0


if __name__ == "__main__":
    sys.exit(main())

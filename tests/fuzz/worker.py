"""A fuzz worker process: runs ranges of cases and reports one JSON line per case.

Protocol (stdin / stdout, one JSON object per line): the parent sends
``{"op", "path", "seed", "start", "stop"}``; the worker answers ``{"start": i}`` before case i
and ``{"i", "cls", "outcome", "detail"}`` after it, then ``{"end": true}``. A crash (signal) or
hang shows up to the parent as a started case without a result.

Outcomes: ok-equal (valid, equal to the NumPy reference), clean-error (invalid, rejected with
InvalidArgument / ValueError / TypeError), mismatch (valid, differs from the reference),
invalid-accepted (invalid, no error), valid-rejected (valid, raised a clean error),
unclean-error (any other exception), n/a (the case cannot be expressed on this path).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import numpy as np

from tests.fuzz.registry import OPS, make_case

CLEAN = (ValueError, TypeError)


def _resolve(name):
    module, fn = name.split(":")
    return getattr(importlib.import_module(module), fn)


def _equal(got, want) -> str | None:
    """None when the outputs equal the reference, else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, reference has {len(want)}"
    for k, (got_k, want_k) in enumerate(zip(got, want)):
        g, w = np.asarray(got_k), np.asarray(want_k)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape}, reference {w.shape}"
        if g.dtype.kind in "iu" or w.dtype.kind in "iu":
            if not np.array_equal(g.astype(np.int64), w.astype(np.int64)):
                return f"output {k}: {g.reshape(-1)[:8]} vs reference {w.reshape(-1)[:8]}"
            continue
        tol = 1e-9 if g.dtype == np.float64 else 2e-4
        if not np.allclose(g, w, rtol=tol, atol=tol):
            err = float(np.max(np.abs(g - w))) if g.size else 0.0
            return f"output {k}: max abs difference {err:.3g}"
    return None


def _clean_errors(path):
    """The exceptions that count as a clean rejection on `path` (the native path needs no TensorFlow)."""
    if path == "native":
        return CLEAN
    import tensorflow as tf

    return (tf.errors.InvalidArgumentError, *CLEAN)


def run_case(case, path, spec=None):
    """(outcome, detail) of one case on one path (in this process)."""
    from tests.fuzz.paths import NotApplicable

    spec = spec or OPS[case.op]
    clean = _clean_errors(path)
    try:
        got = _resolve(spec.run)(case.inputs, path)
    except NotApplicable as err:
        return "n/a", str(err)
    except clean as err:
        message = str(getattr(err, "message", err)).splitlines()[0][:300]
        return ("clean-error" if not case.valid else "valid-rejected"), f"{type(err).__name__}: {message}"
    except Exception as err:
        return "unclean-error", f"{type(err).__name__}: {str(err)[:300]}"
    if not case.valid:
        return "invalid-accepted", ""
    diff = _equal([np.asarray(x) for x in got], _resolve(spec.reference)(case.inputs))
    return ("mismatch", diff) if diff else ("ok-equal", "")


def main() -> None:
    import hybridtf.native  # noqa: F401 - loaded before the first case, so that its time is not a case's

    # HYBRIDTF_FUZZ_NATIVE_ONLY=1: NumPy bindings only, no TensorFlow in the process (the sanitizer run).
    if not os.environ.get("HYBRIDTF_FUZZ_NATIVE_ONLY"):
        import tensorflow as tf

        from hybridtf._src.run.loader import load_ops

        tf.get_logger().setLevel("ERROR")
        load_ops()
        tf.constant(0) + 1  # the eager context
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        for i in range(req["start"], req["stop"]):
            print(json.dumps({"start": i}), flush=True)
            case = make_case(req["op"], req["seed"], i)
            outcome, detail = run_case(case, req["path"])
            print(json.dumps({"i": i, "cls": case.cls, "outcome": outcome, "detail": detail}), flush=True)
        print(json.dumps({"end": True}), flush=True)


if __name__ == "__main__":
    main()

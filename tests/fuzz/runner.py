"""The parent side of a fuzz run: worker processes, crash / hang accounting, reproducers, tables.

Each of ``jobs`` threads owns one worker process (tests/fuzz/worker.py) and feeds it ranges of
cases. A worker that dies (a signal: a crash) or stops answering for ``timeout`` seconds (a hang,
then killed) costs one case: it is counted, its inputs are saved as a reproducer (a pickle that
``tools/fuzz_ops.py --replay`` runs in-process), and a fresh worker goes on after it.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import pickle
import queue
import subprocess
import sys
import threading
import time

from tests.fuzz.registry import OPS, make_case

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTCOMES = (
    "ok-equal",
    "clean-error",
    "crash",
    "hang",
    "mismatch",
    "invalid-accepted",
    "valid-rejected",
    "unclean-error",
    "n/a",
)
FAILURES = ("crash", "hang", "mismatch", "invalid-accepted", "valid-rejected", "unclean-error")
BATCH = 200  # cases per request: a worker reports progress per case anyway


class _Worker:
    def __init__(self, env, startup_timeout=300.0):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        # TensorFlow's import and the op library's load are no case's time.
        ready = self.read(startup_timeout)
        if not (isinstance(ready, dict) and ready.get("ready")):
            self.kill()
            raise RuntimeError(f"a fuzz worker did not start (got {ready!r}); try python -m tests.fuzz.worker")

    def send(self, req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def _pump(self):
        # A thread reads the worker's lines (select() on a buffered pipe would miss buffered lines).
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put("eof")

    def read(self, timeout):
        """The next JSON line, None on timeout, "eof" when the worker died."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.defaultdict(collections.Counter)  # (op, path) -> outcome counts
        self.classes = collections.defaultdict(collections.Counter)  # (op, path) -> class counts
        self.findings = []  # failures: op, path, index, class, outcome, detail, reproducer

    def add(self, op, path, cls, outcome, detail, index, repro=None):
        with self.lock:
            self.counts[(op, path)][outcome] += 1
            self.classes[(op, path)][cls] += 1
            if outcome in FAILURES:
                self.findings.append(
                    dict(op=op, path=path, index=index, cls=cls, outcome=outcome, detail=detail, reproducer=repro)
                )

    def failures(self) -> int:
        return sum(c[o] for c in self.counts.values() for o in FAILURES)


def _save_repro(repro_dir, op, path, seed, index):
    if repro_dir is None:
        return None
    repro_dir = pathlib.Path(repro_dir)
    repro_dir.mkdir(parents=True, exist_ok=True)
    file = repro_dir / f"{op}-{path}-seed{seed}-case{index}.pkl"
    with open(file, "wb") as f:
        pickle.dump(dict(case=make_case(op, seed, index), path=path, seed=seed, index=index), f)
    return str(file)


def _run_stream(tasks, results, seed, timeout, repro_dir, env, deadline):
    worker = None
    try:
        while True:
            try:
                op, path, start, stop = tasks.get_nowait()
            except queue.Empty:
                return
            i = start
            while i < stop and time.monotonic() < deadline:
                if worker is None:
                    worker = _Worker(env)
                end = min(stop, i + BATCH)
                worker.send(dict(op=op, path=path, seed=seed, start=i, stop=end))
                current = None
                while True:
                    msg = worker.read(timeout)
                    if isinstance(msg, dict) and "start" in msg:
                        current = msg["start"]
                        continue
                    if isinstance(msg, dict) and "end" in msg:
                        i = end
                        break
                    if isinstance(msg, dict):
                        results.add(op, path, msg["cls"], msg["outcome"], msg["detail"], msg["i"])
                        i = msg["i"] + 1
                        if time.monotonic() >= deadline:
                            worker.kill()
                            worker = None
                            break
                        continue
                    # Died (crash) or silent (hang): the started case is the culprit.
                    kind = "crash" if msg == "eof" else "hang"
                    worker.kill()
                    code = worker.proc.returncode
                    worker = None
                    if current is None:  # died before starting a case: a broken worker, not a finding
                        raise RuntimeError(f"fuzz worker for {op}/{path} exited with {code} before its first case")
                    case = make_case(op, seed, current)
                    detail = f"signal {-code}" if kind == "crash" and code and code < 0 else f"exit {code}"
                    results.add(
                        op,
                        path,
                        case.cls,
                        kind,
                        detail if kind == "crash" else f"> {timeout}s",
                        current,
                        _save_repro(repro_dir, op, path, seed, current),
                    )
                    i = current + 1
                    break
    finally:
        if worker is not None:
            worker.kill()


def run_fuzz(
    ops=None, paths=None, cases=100, seed=0, timeout=30.0, jobs=2, repro_dir=None, time_limit=None, env_extra=None
) -> Results:
    """Runs `cases` cases of every (op, path) in worker processes; returns the Results."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT), **(env_extra or {}))
    tasks = queue.Queue()
    # Round robin over the (op, path) streams, one batch at a time: a run cut short by time_limit
    # has covered every stream about equally.
    streams = [(op, path) for op in ops or OPS for path in OPS[op].paths if paths is None or path in paths]
    for start in range(0, cases, BATCH):
        for op, path in streams:
            tasks.put((op, path, start, min(cases, start + BATCH)))
    results = Results()
    deadline = time.monotonic() + (time_limit or 1e9)
    threads = [
        threading.Thread(target=_run_stream, args=(tasks, results, seed, timeout, repro_dir, env, deadline))
        for _ in range(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def markdown(results: Results) -> str:
    """One row per (op, path): cases per input class, then outcomes."""
    from tests.fuzz.cases import CLASSES

    head = ["op", "path", "cases", *CLASSES, *OUTCOMES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    total = collections.Counter()
    for op, path in sorted(results.counts):
        counts, classes = results.counts[(op, path)], results.classes[(op, path)]
        n = sum(counts.values())
        total.update(counts)
        total["cases"] += n
        for c in CLASSES:
            total["cls:" + c] += classes[c]
        lines.append(
            "| "
            + " | ".join([op, path, str(n), *(str(classes[c]) for c in CLASSES), *(str(counts[o]) for o in OUTCOMES)])
            + " |"
        )
    lines.append(
        "| "
        + " | ".join(
            [
                "**all**",
                "",
                str(total["cases"]),
                *(str(total["cls:" + c]) for c in CLASSES),
                *(str(total[o]) for o in OUTCOMES),
            ]
        )
        + " |"
    )
    return "\n".join(lines)


def to_json(results: Results) -> dict:
    return dict(
        counts={f"{op}/{path}": dict(c) for (op, path), c in sorted(results.counts.items())},
        classes={f"{op}/{path}": dict(c) for (op, path), c in sorted(results.classes.items())},
        findings=results.findings,
    )

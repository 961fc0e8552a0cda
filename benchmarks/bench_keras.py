"""Benchmark: plain Keras CTR models vs the same models after ``hybridtf.keras.optimize``, same run.

For every configuration (model x field set x optimizer) the plain model (baseline) and the
optimized model train in two fresh subprocesses of this script (``--child``), one after the
other, with the same seeds, initial weights and batches, so peak RSS is per model (with
``--repeats N`` the pair runs N times, alternating, and each variant's fastest run counts). Each
child:

* generates ``warmup + steps`` synthetic batches (``hybridtf.models``), caches them in a
  ``tf.data.Dataset`` in memory and iterates it once, so data generation is not timed;
* builds the model (``hybridtf.models``), optimizes it (hybridtf child only), compiles it
  and runs ``model.fit`` for one epoch over the cached batches;
* times the steps with a Keras callback (a timestamp at the end of every batch; the first
  ``warmup`` steps, tracing included, are not timed): ``samples_per_s`` is the batch size over the
  median step time (robust to other processes stealing the CPU for a while),
  ``samples_per_s_mean`` the batch size times the timed steps over their total time;
* records every step's loss (the loss metric is reset before each batch, so the logged loss is
  that batch's loss): ``loss_max_rel_diff`` is the largest relative difference between the two
  models' losses at the same step;
* reports ``ru_maxrss`` after training, then counts the ops of the training step with
  ``hybridtf.report.count_ops`` (graph as traced, and after Grappler).

Field sets:

* ``criteo``: Criteo's 26 one-hot fields, dim 16, vocabularies capped at 100,000, 13 dense
  features. For DIN two behaviour sequences ``hist_C3`` / ``hist_C4`` (multi-hot, up to 20 ids,
  5 on average) are added, looked up in the tables of their targets ``C3`` / ``C4`` (DIN's shared
  embeddings): 28 lookups of 26 tables.
* ``f200``: 200 fields (``ctr_data.many_fields``), dims 8 and 16, vocabularies 100 .. 100,000,
  13 dense features; all one-hot, except for DIN: 10% multi-hot, each attending over a one-hot
  target field of the same dim.

Models: the package's examples (``hybridtf.models``: ``wdl``, ``deepfm``, ``dlrm``, ``din``)
and DeepCTR 0.9.4's with DeepCTR's default arguments (``benchmarks/deepctr_models.py``:
``deepctr_wdl``, ``deepctr_deepfm``, ``deepctr_dcn``, ``deepctr_xdeepfm``, ``deepctr_din``; their
hidden widths are DeepCTR's, ``--hidden`` does not apply). DeepCTR's FM and CIN need one embedding
dim, so the DeepCTR models use dim 8 for every field of ``f200``.

Prints a table, writes a PNG chart (samples/s and op counts per configuration; needs matplotlib,
skipped with a note without it) and the results as JSON to ``--out-dir`` (default
``benchmarks/results/``), and prints one JSON object as the last line of stdout.

    python benchmarks/bench_keras.py                       # the default configurations (minutes)
    python benchmarks/bench_keras.py --models wdl,dlrm --fields criteo,f200 --optimizers adagrad \\
        --batch 4096 --steps 30
    python benchmarks/bench_keras.py --quick               # tiny smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hybridtf._src.models import ctr_data, examples  # noqa: E402  (TensorFlow-free: the parent never imports TF)

MODELS = ("wdl", "deepfm", "dlrm", "din")
DEEPCTR_MODELS = tuple(f"deepctr_{k}" for k in ("wdl", "deepfm", "dcn", "xdeepfm", "din"))
ALL_MODELS = MODELS + DEEPCTR_MODELS
FIELD_SETS = ("criteo", "f200")
OPTIMIZERS = ("adagrad", "adam", "sgd", "lazy_adam")
N_DENSE = ctr_data.CRITEO_NUM_DENSE
DEFAULT_CONFIGS = [(m, f, "adagrad") for f in FIELD_SETS for m in MODELS] + [
    ("wdl", "f200", "adam"),
    ("wdl", "f200", "lazy_adam"),
]
VARIANTS = ("plain", "hybridtf")


@dataclasses.dataclass(frozen=True)
class Config:
    """One benchmark configuration (both variants run it)."""

    model: str
    fields: str
    optimizer: str
    batch: int = 4096
    steps: int = 30
    warmup: int = 5
    hidden: tuple[int, ...] = (64, 32)
    quick: bool = False
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.model}/{self.fields}/{self.optimizer}"

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        return cls(**{**d, "hidden": tuple(d["hidden"])})


# --------------------------------------------------------------------------- models and data


def make_fields(config: Config) -> list[ctr_data.FieldSpec]:
    """The field set of ``config`` (``hybridtf.models.example_fields``); ``quick`` shrinks it."""
    return examples.example_fields(
        config.fields,
        din=config.model in ("din", "deepctr_din"),
        quick=config.quick,
        dims=(8,) if _deepctr_kind(config) else None,
        seed=config.seed,
    )


def _deepctr_kind(config: Config) -> str | None:
    return config.model[len("deepctr_") :] if config.model.startswith("deepctr_") else None


def build_model(config: Config, fields, sample_x):
    """The plain Keras model of ``config``, built on ``sample_x`` (same seed: same weights)."""
    if _deepctr_kind(config):
        from benchmarks import deepctr_models

        model = deepctr_models.build(_deepctr_kind(config), fields, N_DENSE, seed=config.seed)
        model(sample_x)
        return model
    return examples.build_example(
        config.model, fields, sample_x, n_dense=N_DENSE, hidden=config.hidden, seed=config.seed
    )


def make_optimizer(name: str):
    """A fresh Keras optimizer; LookupError when hybridtf has no lazy Adam yet."""
    import tensorflow as tf

    if name == "lazy_adam":
        import hybridtf.keras

        lazy_adam = getattr(hybridtf.keras, "LazyAdam", None)
        if lazy_adam is None:
            raise LookupError("hybridtf.keras has no LazyAdam yet")
        return lazy_adam(learning_rate=1e-3)
    makers = {
        "adagrad": lambda: tf.keras.optimizers.Adagrad(learning_rate=0.05),
        "adam": lambda: tf.keras.optimizers.Adam(learning_rate=1e-3),
        "sgd": lambda: tf.keras.optimizers.SGD(learning_rate=0.05),
    }
    return makers[name]()


def sample_batch(config: Config, fields):
    """Batch 0 of the benchmark stream of ``config`` as tensors ``(features, labels)``."""
    import tensorflow as tf

    x, y = ctr_data.generate_batch(fields, N_DENSE, config.batch, 0, seed=config.seed)
    return ctr_data.to_tensors(x), tf.constant(y)


# --------------------------------------------------------------------------- child: one model


def run_child(config: Config, variant: str) -> dict:
    import resource

    import tensorflow as tf

    import hybridtf.keras
    from hybridtf.report import count_ops

    tf.keras.utils.set_random_seed(config.seed)
    out = {"variant": variant, "tensorflow": tf.__version__}
    try:
        optimizer = make_optimizer(config.optimizer)
    except LookupError as err:
        return {**out, "skipped": str(err)}
    fields = make_fields(config)
    num_batches = config.warmup + config.steps
    t0 = time.perf_counter()
    dataset = ctr_data.make_dataset(fields, N_DENSE, config.batch, num_batches, seed=config.seed)
    if _deepctr_kind(config):
        from benchmarks import deepctr_models

        dataset = dataset.map(deepctr_models.adapt(_deepctr_kind(config), fields))
    dataset = dataset.cache()
    for _ in dataset:  # fills the in-memory cache: fit reads memory, generation is not timed
        pass
    out["data_s"] = time.perf_counter() - t0
    sample_x, _ = next(iter(dataset))
    model = build_model(config, fields, sample_x)
    if variant == "hybridtf":
        model = hybridtf.keras.optimize(model)
        out["packed_tables"] = len(model.hybridtf_plan.packed_tables) if model.hybridtf_plan else 0
        out["skipped_layers"] = [s.name for s in model.hybridtf_skipped]
    model.compile(optimizer=optimizer, loss="binary_crossentropy")

    times, losses = [], []

    class StepRecorder(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.model.reset_metrics()  # the loss metric then holds this batch's loss only

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())
            losses.append(float(logs["loss"]))

    t_fit = time.perf_counter()
    model.fit(dataset.prefetch(2), epochs=1, verbose=0, callbacks=[StepRecorder()])
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if len(times) != num_batches:
        raise RuntimeError(f"fit ran {len(times)} steps, expected {num_batches}.")
    step_s = [b - a for a, b in zip(times[config.warmup - 1 :], times[config.warmup :])]
    out.update(
        first_step_s=times[0] - t_fit,
        timed_steps=len(step_s),
        samples_per_s=config.batch / statistics.median(step_s),
        samples_per_s_mean=config.batch * len(step_s) / (times[-1] - times[config.warmup - 1]),
        step_ms_median=statistics.median(step_s) * 1e3,
        step_ms=[round(t * 1e3, 3) for t in step_s],
        losses=losses,
    )
    t0 = time.perf_counter()
    ops = count_ops(model, dataset)
    out.update(
        count_s=time.perf_counter() - t0,
        ops=ops["total"],
        ops_grappler=ops["grappler_total"],
        ops_grappler_error=ops["grappler_error"],
        ops_by_type=dict(ops["grappler_by_type"] or ops["by_type"]),
    )
    return out


# --------------------------------------------------------------------------- parent


def _ratio(a, b):
    return a / b if a is not None and b else None


def run_variant(config: Config, variant: str, timeout_s: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    payload = json.dumps({"config": dataclasses.asdict(config), "variant": variant})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", payload]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"timed out after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        return {"variant": variant, "error": f"exit {proc.returncode}: " + "\n".join(tail)}
    return json.loads(lines[-1])


def run_config(config: Config, repeats: int, timeout_s: float) -> dict:
    """Runs the two variants ``repeats`` times, alternating; keeps each variant's fastest run."""
    runs = {"plain": [], "hybridtf": []}
    for _ in range(repeats):
        for variant in VARIANTS:
            result = run_variant(config, variant, timeout_s)
            runs[variant].append(result)
            if "skipped" in result or "error" in result:
                return compare(config, result if variant == "plain" else runs["plain"][-1], result)
    best = {v: max(rs, key=lambda r: r["samples_per_s"]) for v, rs in runs.items()}
    for variant, rs in runs.items():
        best[variant]["samples_per_s_runs"] = [r["samples_per_s"] for r in rs]
        # TensorFlow on CPU is not bit-reproducible run to run for every model: this is the noise floor.
        repeat_diffs = [_max_rel_diff(rs[0]["losses"], r["losses"]) for r in rs[1:]]
        best[variant]["loss_repeat_max_rel_diff"] = max(repeat_diffs) if repeat_diffs else None
    return compare(config, best["plain"], best["hybridtf"])


def _max_rel_diff(reference, other) -> float:
    return max((abs(b - a) / max(abs(a), 1e-12) for a, b in zip(reference, other)), default=0.0)


def compare(config: Config, plain: dict, hybrid: dict | None) -> dict:
    row = {"label": config.label, "config": dataclasses.asdict(config), "plain": plain, "hybridtf": hybrid}
    if "skipped" in plain:
        row["skipped"] = plain["skipped"]
        return row
    if "error" in plain or "error" in hybrid:
        row["error"] = plain.get("error") or hybrid.get("error")
        return row
    row.update(
        speedup=_ratio(hybrid["samples_per_s"], plain["samples_per_s"]),
        ops_ratio=_ratio(hybrid["ops"], plain["ops"]),
        ops_grappler_ratio=_ratio(hybrid["ops_grappler"], plain["ops_grappler"]),
        rss_ratio=_ratio(hybrid["peak_rss_mib"], plain["peak_rss_mib"]),
        loss_max_rel_diff=_max_rel_diff(plain["losses"], hybrid["losses"]),
    )
    return row


def _fmt(value, spec) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'config':24} {'plain/s':>9} {'htf/s':>9} {'speedup':>8} {'ops':>13} {'ratio':>6} "
        f"{'ops Grappler':>13} {'ratio':>6} {'RSS MiB':>13} {'ratio':>6} {'loss diff':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if "speedup" not in r:
            print(f"{r['label']:24} {r.get('skipped') or r.get('error', '').splitlines()[0]}")
            continue
        p, h = r["plain"], r["hybridtf"]
        print(
            f"{r['label']:24} {p['samples_per_s']:9.0f} {h['samples_per_s']:9.0f} {r['speedup']:7.2f}x "
            f"{p['ops']:>6}/{h['ops']:<6} {_fmt(r['ops_ratio'], '6.3f')} "
            f"{_fmt(p['ops_grappler'], '>6')}/{_fmt(h['ops_grappler'], '<6')} {_fmt(r['ops_grappler_ratio'], '6.3f')} "
            f"{p['peak_rss_mib']:>6.0f}/{h['peak_rss_mib']:<6.0f} {r['rss_ratio']:6.2f} {r['loss_max_rel_diff']:9.1e}"
        )
    for r in rows:
        noise = [(v, r[v].get("loss_repeat_max_rel_diff")) for v in VARIANTS if r.get(v)]
        noise = [f"{v} {d:.1e}" for v, d in noise if d]
        if noise:
            print(f"note: {r['label']}: the same model's losses differ between repeats by up to {', '.join(noise)}")


def write_chart(rows: list[dict], path: Path) -> str | None:
    """Bars of samples/s and op counts (after Grappler when counted), baseline vs hybridtf; None or an error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    done = [r for r in rows if "speedup" in r]
    if not done:
        return "no configuration finished: no chart"
    labels = [r["label"] for r in done]
    xs = range(len(done))
    width = 0.38
    fig, (ax_sps, ax_ops) = plt.subplots(2, 1, figsize=(max(7.0, 1.1 * len(done) + 2), 8))
    grappler = all(r["plain"]["ops_grappler"] and r["hybridtf"]["ops_grappler"] for r in done)
    ops_key = "ops_grappler" if grappler else "ops"
    for ax, key, title in (
        (ax_sps, "samples_per_s", "training throughput (samples/s, higher is better)"),
        (ax_ops, ops_key, "training-step ops" + (" after Grappler" if grappler else "") + " (lower is better)"),
    ):
        plain = [r["plain"][key] for r in done]
        hybrid = [r["hybridtf"][key] for r in done]
        ax.bar([x - width / 2 for x in xs], plain, width, label="plain Keras", color="#9aa5b1")
        bars = ax.bar([x + width / 2 for x in xs], hybrid, width, label="hybridtf", color="#d9480f")
        for bar, r in zip(bars, done):
            ratio = _ratio(r["hybridtf"][key], r["plain"][key])
            note = f"{ratio:.2f}x" if key == "samples_per_s" else f"{ratio:.2f}"
            ax.annotate(
                note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
            )
        ax.set_title(title, fontsize=10)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
    batch = done[0]["config"]["batch"]
    fig.suptitle(f"hybridtf vs plain Keras, batch {batch}, {os.cpu_count()} CPU cores", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def configs_from_args(args) -> list[Config]:
    quick = {"batch": 256, "steps": 5, "warmup": 2, "hidden": (16, 8), "quick": True}
    common = dict(quick) if args.quick else {}
    for key in ("batch", "steps", "warmup"):
        if getattr(args, key) is not None:
            common[key] = getattr(args, key)
    if args.hidden:
        common["hidden"] = tuple(int(w) for w in args.hidden.split(","))
    if not (args.models or args.fields or args.optimizers or args.quick):
        triples = DEFAULT_CONFIGS
    else:
        models = _split(args.models, ALL_MODELS) or (["wdl"] if args.quick else list(MODELS))
        fields = _split(args.fields, FIELD_SETS) or (["criteo"] if args.quick else list(FIELD_SETS))
        optimizers = _split(args.optimizers, OPTIMIZERS) or ["adagrad"]
        triples = [(m, f, o) for f in fields for m in models for o in optimizers]
    return [Config(m, f, o, **common) for m, f, o in triples]


def _split(value: str | None, allowed) -> list[str]:
    if not value:
        return []
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SystemExit(f"unknown {bad}; choose from {', '.join(allowed)}.")
    return items


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated, from {','.join(ALL_MODELS)}")
    parser.add_argument("--fields", help=f"comma-separated, from {','.join(FIELD_SETS)}")
    parser.add_argument("--optimizers", help=f"comma-separated, from {','.join(OPTIMIZERS)}")
    parser.add_argument("--batch", type=int, help="examples per step (default 4096; --quick: 256)")
    parser.add_argument("--steps", type=int, help="timed steps after the warm-up (default 30; --quick: 5)")
    parser.add_argument("--warmup", type=int, help="untimed first steps, tracing included (default 5; --quick: 2)")
    parser.add_argument("--hidden", help="MLP widths, e.g. 64,32 (default)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (wdl/criteo/adagrad, small tables)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per variant, alternating; the fastest counts (default 1)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        request = json.loads(args.child)
        print(json.dumps(run_child(Config.from_dict(request["config"]), request["variant"])))
        return
    if (args.warmup is not None and args.warmup < 1) or (args.steps is not None and args.steps < 1) or args.repeats < 1:
        parser.error("need --warmup >= 1, --steps >= 1 and --repeats >= 1.")

    rows = []
    for config in configs_from_args(args):
        print(f"running {config.label} (batch {config.batch}, {config.steps} steps) ...", file=sys.stderr, flush=True)
        rows.append(run_config(config, args.repeats, args.timeout))
    print_table(rows)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    chart = args.out_dir / f"bench_keras-{stamp}.png"
    chart_error = write_chart(rows, chart)
    results = {
        "benchmark": "keras",
        "tensorflow": next((r["plain"].get("tensorflow") for r in rows if r.get("plain")), None),
        "cpu_count": os.cpu_count(),
        "chart": None if chart_error else str(chart),
        "chart_error": chart_error,
        "configs": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"bench_keras-{stamp}.json").write_text(json.dumps(results, indent=1))
    if chart_error:
        print(f"note: {chart_error}")
    else:
        print(f"chart: {chart}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""Op self-time of a few training steps of one ``bench_keras.py`` configuration (TF profiler).

Builds the model, data and optimizer exactly as ``bench_keras.py`` does, trains ``--warmup``
steps, then profiles ``--steps`` steps of ``model.fit`` and prints the op self-time per step,
by op type and by top-level name scope (host CPU ops; executor and function-call events left
out). On a shared machine the absolute times inflate with the load: compare shares.

    python benchmarks/profile_keras.py --model deepctr_wdl --fields f200 --variant hybridtf
    python benchmarks/profile_keras.py --model deepctr_din --fields criteo --variant plain --steps 5
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import bench_keras  # noqa: E402
from hybridtf._src.models import ctr_data  # noqa: E402


def host_op_events(logdir: str):
    """``(op name, op type, self-time in ps)`` of every TF op the host ran in the profile under ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    path = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))[-1]
    space.ParseFromString(Path(path).read_bytes())
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if line.name == "python" or "Steps" in line.name:
                continue
            for event in line.events:
                label = plane.event_metadata[event.metadata_id].name
                if ":" not in label or "PartitionedCall" in label or label.startswith(("ExecutorState", "__inference")):
                    continue
                name, _, op_type = label.rpartition(":")
                yield name, op_type, event.duration_ps


def profile(config: bench_keras.Config, variant: str) -> tuple[float, dict, dict]:
    """``(wall ms per step, op type -> ms per step, scope/op type -> ms per step)``."""
    import tensorflow as tf

    import hybridtf.keras

    tf.keras.utils.set_random_seed(config.seed)
    fields = bench_keras.make_fields(config)
    dataset = ctr_data.make_dataset(
        fields, bench_keras.N_DENSE, config.batch, config.warmup + config.steps, seed=config.seed
    )
    kind = bench_keras._deepctr_kind(config)
    if kind:
        from benchmarks import deepctr_models

        dataset = dataset.map(deepctr_models.adapt(kind, fields))
    dataset = dataset.cache()
    for _ in dataset:
        pass
    model = bench_keras.build_model(config, fields, next(iter(dataset))[0])
    if variant == "hybridtf":
        model = hybridtf.keras.optimize(model)
    model.compile(optimizer=bench_keras.make_optimizer(config.optimizer), loss="binary_crossentropy")
    model.fit(dataset.take(config.warmup), epochs=1, verbose=0)
    logdir = tempfile.mkdtemp(prefix="profile_keras_")
    start = time.perf_counter()
    tf.profiler.experimental.start(logdir)
    model.fit(dataset.skip(config.warmup), epochs=1, verbose=0)
    tf.profiler.experimental.stop()
    wall = (time.perf_counter() - start) / config.steps * 1e3
    by_type, by_scope = collections.Counter(), collections.Counter()
    for name, op_type, ps in host_op_events(logdir):
        ms = ps * 1e-9 / config.steps
        by_type[op_type] += ms
        by_scope[f"{name.split('/')[0]}/{op_type}"] += ms
    return wall, dict(by_type), dict(by_scope)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=bench_keras.ALL_MODELS)
    parser.add_argument("--fields", required=True, choices=bench_keras.FIELD_SETS)
    parser.add_argument("--variant", default="hybridtf", choices=bench_keras.VARIANTS)
    parser.add_argument("--optimizer", default="adagrad", choices=bench_keras.OPTIMIZERS)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps before profiling (tracing included)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    config = bench_keras.Config(
        model=args.model,
        fields=args.fields,
        optimizer=args.optimizer,
        batch=args.batch,
        steps=args.steps,
        warmup=args.warmup,
    )
    wall, by_type, by_scope = profile(config, args.variant)
    print(f"{config.label} {args.variant}: wall {wall:.1f} ms/step, op self-time {sum(by_type.values()):.1f} ms/step")
    for title, table in (("op type", by_type), ("scope/op type", by_scope)):
        print(f"--- by {title}")
        for key, ms in collections.Counter(table).most_common(args.top):
            print(f"{ms:9.2f} ms  {key}")


if __name__ == "__main__":
    main()

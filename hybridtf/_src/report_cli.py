"""``python -m hybridtf.report``: the report on a built-in example model or on the user's own.

``--model`` names a built-in example (``wdl``, ``deepfm``, ``dlrm``, ``din`` on the ``--fields``
set, ``hybridtf.models``) or the user's builder as ``package.module:function`` (importable from the
current directory) or ``path/to/file.py:function``. The builder takes no arguments and returns a
built Keras model (functional, or called once); it is called twice, for the plain baseline and for
the model ``hybridtf.keras.optimize`` wraps, so both start from the same code. A builder that
returns a compiled model keeps its loss and a fresh copy of its optimizer; otherwise ``--optimizer``
and ``--loss`` apply. The traced batch is the example's synthetic data, or for a user model
``synthetic_batch`` of its inputs (ids 0, standard normal floats, zero labels).

Example::

    python -m hybridtf.report --model wdl --fields 200
    python -m hybridtf.report --model my_pkg.my_module:build_model --batch 512 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import sys

from hybridtf._src.errors import HybridTFError
from hybridtf._src.models.examples import EXAMPLE_MODELS


class UsageError(ValueError):
    """A ``--model`` that cannot be loaded: the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """What ``--model`` named: a built-in example, or a user builder ``module:function``."""

    name: str
    example: str | None = None
    module: str | None = None
    function: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSource:
        """Parses ``wdl`` / ``pkg.mod:build`` / ``path/file.py:build``.

        Raises:
            UsageError: neither an example name nor ``module:function``.
        """
        if text in EXAMPLE_MODELS:
            return cls(text, example=text)
        module, sep, function = text.rpartition(":")
        if not sep or not module or not function.isidentifier():
            raise UsageError(
                f"--model {text!r} is neither a built-in example ({', '.join(EXAMPLE_MODELS)}) nor a builder "
                "'package.module:function' / 'path/to/file.py:function' that returns a built Keras model."
            )
        return cls(text, module=module, function=function)


def load_builder(source: ModelSource):
    """The user's builder function named by ``source``.

    Raises:
        UsageError: the module or function cannot be found, or is not callable.
    """
    module_name = source.module
    try:
        if module_name.endswith(".py"):
            path = pathlib.Path(module_name).resolve()
            if not path.is_file():
                raise UsageError(f"--model {source.name!r}: no file {path}.")
            name = f"_hybridtf_user_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(pathlib.Path.cwd()) not in sys.path:
                sys.path.insert(0, "")  # like `python -m`: modules of the current directory
            module = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        not_found = isinstance(err, ModuleNotFoundError) and missing and (module_name + ".").startswith(missing + ".")
        if module_name.endswith(".py") or not not_found:
            raise  # the module was found and its own import failed: the user's traceback says why
        raise UsageError(
            f"--model {source.name!r}: cannot import {module_name!r} ({err}); run from the directory that holds "
            "it, set PYTHONPATH, or give the file path: path/to/file.py:function."
        ) from err
    builder = getattr(module, source.function, None)
    if not callable(builder):
        raise UsageError(f"--model {source.name!r}: {module_name!r} has no function {source.function!r}.")
    return builder


def _user_model(builder, name: str):
    import tensorflow as tf

    try:
        inspect.signature(builder).bind()
    except TypeError as err:  # a builder that needs arguments
        raise UsageError(f"--model {name!r}: the builder must take no arguments ({err}).") from err
    except ValueError:  # no signature to read (a builtin): just call it
        pass
    model = builder()
    if not isinstance(model, tf.keras.Model):
        raise UsageError(f"--model {name!r}: the builder returned {type(model).__name__}, not a tf.keras.Model.")
    if not model.built:
        raise UsageError(
            f"--model {name!r}: the builder returned an unbuilt model; build it (a functional model, or call it "
            "once on a batch) before returning it."
        )
    return model


def _compile_args(model, optimizer: str, loss: str):
    """(optimizer factory, loss): the model's own when the builder compiled it, else the flags'."""
    import tensorflow as tf

    from hybridtf._src.caching.layer import DynamicEmbedding
    from hybridtf._src.caching.optimizer import dynamic_optimizer

    if getattr(model, "_is_compiled", False) and model.optimizer is not None and model.loss is not None:
        opt = model.optimizer
        return (lambda: type(opt).from_config(opt.get_config())), model.loss
    try:
        tf.keras.optimizers.get(optimizer)
    except ValueError as err:
        raise UsageError(f"--optimizer {optimizer!r} is not a Keras optimizer name ({err}).") from err
    try:
        tf.keras.losses.get(loss)
    except ValueError as err:
        raise UsageError(f"--loss {loss!r} is not a Keras loss name ({err}).") from err
    if any(isinstance(layer, DynamicEmbedding) for layer in model._flatten_layers()):  # tables train through it
        return (lambda: dynamic_optimizer(tf.keras.optimizers.get(optimizer))), loss
    return (lambda: tf.keras.optimizers.get(optimizer)), loss


def build_pair(args, source: ModelSource):
    """``(plain, optimized, batch, config)`` for the parsed command line."""
    import hybridtf.keras
    from hybridtf._src.models import examples
    from hybridtf._src.op_count import synthetic_batch

    options = {
        "micro_batches": args.micro_batches,
        "interleave_from": args.interleave_from,
        "interleave_groups": args.interleave_groups,
    }
    if source.example is not None:
        given = [f"--{flag}" for flag in ("optimizer", "loss") if getattr(args, flag) is not None]
        if given:
            raise UsageError(
                f"{' and '.join(given)} set the training of a user model (--model module:function); the built-in "
                f"example {source.example!r} trains with the benchmark's Adagrad and binary cross-entropy."
            )
        fields = examples.example_fields(args.fields, din=source.example == "din")
        batch = examples.example_batch(fields, args.batch)
        plain = examples.build_example(source.example, fields, batch[0])
        model = hybridtf.keras.optimize(examples.build_example(source.example, fields, batch[0]), **options)
        for m in (plain, model):  # the benchmark's Adagrad (bench_keras.make_optimizer)
            m.compile(optimizer=_adagrad(), loss="binary_crossentropy")
        field_set = "f200" if args.fields in ("200", "f200") else "criteo"
        config = {"model": source.example, "fields": field_set, "optimizer": "adagrad", "batch": args.batch}
        return plain, model, batch, config
    builder = load_builder(source)
    plain = _user_model(builder, source.name)
    make_optimizer, loss = _compile_args(plain, args.optimizer or "adagrad", args.loss or "binary_crossentropy")
    model = hybridtf.keras.optimize(_user_model(builder, source.name), **options)
    for m in (plain, model):
        m.compile(optimizer=make_optimizer(), loss=loss)
    batch = synthetic_batch(plain, args.batch)
    config = {"model": source.name, "optimizer": type(plain.optimizer).__name__, "batch": args.batch}
    return plain, model, batch, config


def _adagrad():
    import tensorflow as tf

    return tf.keras.optimizers.Adagrad(learning_rate=0.05)


def parser() -> argparse.ArgumentParser:
    """The command line's argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m hybridtf.report",
        description="What hybridtf.keras.optimize does to a model: training-step ops before/after, plan, skipped "
        "tables and why, fusions, interleaving.",
    )
    p.add_argument(
        "--model",
        default="wdl",
        help=f"a built-in example ({', '.join(EXAMPLE_MODELS)}) or your builder: package.module:function or "
        "path/to/file.py:function, returning a built Keras model (default wdl); none: only the --dynamic section",
    )
    p.add_argument("--fields", choices=("criteo", "200", "f200"), default="criteo", help="field set of the examples")
    p.add_argument(
        "--batch",
        type=int,
        default=256,
        help="global batch size of the traced step (default 256; --ranks splits it over the ranks)",
    )
    p.add_argument(
        "--ranks", type=int, default=2, help="estimate bytes sent per rank per step on this many ranks (0: skip)"
    )
    p.add_argument("--optimizer", default=None, help="Keras optimizer of an uncompiled user model (default adagrad)")
    p.add_argument("--loss", default=None, help="Keras loss of an uncompiled user model (default binary_crossentropy)")
    p.add_argument("--micro-batches", type=int, default=1, help="D-interleaving: micro-batches per step")
    p.add_argument("--interleave-from", choices=("embedding", "mlp", "mlp_fused"), default="embedding")
    p.add_argument("--interleave-groups", type=int, default=None, help="K-interleaving: number of groups")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--dynamic",
        type=int,
        default=0,
        metavar="STEPS",
        help="add the dynamic-table (HybridHash) section: a small demo model of two DynamicEmbedding fields trains "
        "STEPS steps of --batch examples; with --model none only that section (a user model's own dynamic tables "
        "are in its report)",
    )
    p.add_argument(
        "--timing",
        type=int,
        default=0,
        metavar="STEPS",
        help="add where the step's time goes (median of STEPS timed steps + one profiled step), with the "
        "interleaving flags given and without them",
    )
    return p


def _out(text) -> None:
    """Prints a section of the report: under ``horovodrun``, on rank 0 only (every rank builds the same report).

    The rank is Horovod's when the model's builder initialized it, else the one ``horovodrun`` gives the process.
    """
    from hybridtf._src.distribute.world import current_world

    world = current_world()
    rank = world.rank if world.distributed else os.environ.get("HOROVOD_RANK", "0")
    if str(rank) == "0":
        print(text)


MAX_BATCH = 2**24  # examples of the synthetic batch the report traces (held in memory)


def main(argv=None) -> int:
    """Runs the command (see the module docstring); returns the exit status."""
    args_parser = parser()
    args = args_parser.parse_args(argv)
    if not 1 <= args.batch <= MAX_BATCH:
        args_parser.error(
            f"--batch must be in [1, {MAX_BATCH}] (the report builds a synthetic batch of that many examples), "
            f"got {args.batch}."
        )
    if args.timing < 0:
        args_parser.error(f"--timing must be >= 0 steps, got {args.timing}.")
    if args.dynamic < 0:
        args_parser.error(f"--dynamic must be >= 0 steps, got {args.dynamic}.")
    if args.ranks < 0:
        args_parser.error(f"--ranks must be >= 0 (0: skip the traffic estimate), got {args.ranks}.")
    if args.ranks > args.batch:
        args_parser.error(f"--ranks {args.ranks} exceeds --batch {args.batch}: every rank needs examples of the batch.")
    if args.ranks and args.batch % args.ranks:
        fit = args.ranks * max(1, round(args.batch / args.ranks))
        args_parser.error(
            f"--batch {args.batch} must be divisible by --ranks {args.ranks} (each rank traces an equal share of "
            f"the global batch); try --batch {fit}."
        )
    if args.micro_batches < 1:
        args_parser.error(f"--micro-batches must be >= 1, got {args.micro_batches}.")
    if args.interleave_groups is not None and args.interleave_groups < 1:
        args_parser.error(f"--interleave-groups must be >= 1 (1: no K-interleaving), got {args.interleave_groups}.")
    if args.model == "none" and not args.dynamic:
        args_parser.error("--model none reports only the dynamic-tables section: add --dynamic STEPS.")
    if args.dynamic:  # HybridHash statistics of a small DynamicEmbedding model (report_dynamic.py)
        from hybridtf._src.report_dynamic import dynamic_section

        section = dynamic_section(steps=args.dynamic, batch=args.batch)
        _out(json.dumps({"dynamic_tables": section.to_dict()}) if args.json else section)
    if args.model == "none":
        return 0
    from hybridtf._src.report import report

    try:
        source = ModelSource.parse(args.model)
        plain, model, batch, config = build_pair(args, source)
    except UsageError as err:
        args_parser.error(str(err))
    except HybridTFError as err:  # hybridtf refuses the model with these options: its message names the fix
        print(f"{args_parser.prog}: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    # timed first: the dynamic tables' statistics then show the timed steps
    timing = _timing(args, source, model, batch) if args.timing else None
    result = report(model, batch, baseline=plain, num_ranks=args.ranks or None)
    if args.json:
        d = result.to_dict()
        d["config"] = config
        if timing is not None:
            d["timing"] = timing.to_dict()
        _out(json.dumps(d))
    else:
        label = "/".join(str(config[k]) for k in ("model", "fields", "optimizer") if k in config)
        _out(f"config: {label} (batch {config['batch']})")
        _out(result)
        if timing is not None:
            _out(timing)
    return 0


def _timing(args, source: ModelSource, model, batch):
    """The timing section: ``model`` and, when interleaving flags are set, the same model optimized without."""
    from hybridtf._src.report_timing import timing_section

    interleaved = args.micro_batches > 1 or args.interleave_groups not in (None, 1)
    without = None
    if interleaved:
        plain_args = argparse.Namespace(**{**vars(args), "micro_batches": 1, "interleave_groups": None})
        _, without, _, _ = build_pair(plain_args, source)
    return timing_section(model, batch, without=without, steps=args.timing)

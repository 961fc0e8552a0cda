"""The fuzzed ops: per op its case generator, input classes, paths and run / reference functions.

NumPy only (no TensorFlow): the parent process of a fuzz run uses it to regenerate cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tests.fuzz import cases as c
from tests.fuzz import cases_dice as cd
from tests.fuzz import cases_stitch as cs

FULL = ("valid", "int64_extremes", "wrapping_sums", "bad_attrs", "empty", "mismatched")


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    generate: Callable
    classes: tuple[str, ...]
    paths: tuple[str, ...]
    run: str  # "module:function" taking (inputs, path)
    reference: str  # "module:function" taking (inputs)


def _spec(name, generate, classes, paths, fn, module="tests.fuzz.paths"):
    return OpSpec(name, generate, classes, paths, f"{module}:run_{fn}", f"{module}:ref_{fn}")


_STITCH = "tests.fuzz.paths_stitch"
_DICE = "tests.fuzz.paths_dice"
OPS = {
    s.name: s
    for s in (
        _spec(
            "GatherRows",
            c.gen_gather_rows,
            ("valid", "int64_extremes", "empty", "mismatched"),
            ("raw", "wrapper"),
            "gather_rows",
        ),
        _spec(
            "RegularizationPenalty",
            c.gen_regularization_penalty,
            ("valid", "int64_extremes", "wrapping_sums", "bad_attrs", "empty", "mismatched"),
            ("raw", "wrapper"),
            "regularization_penalty",
        ),
        _spec("PackIds", c.gen_pack_ids, FULL, ("raw", "wrapper", "native"), "pack_ids"),
        _spec(
            "BagSplits",
            c.gen_bag_splits,
            ("valid", "int64_extremes", "empty", "mismatched"),
            ("raw", "wrapper"),
            "bag_splits",
        ),
        *(
            _spec(
                op,
                c.gen_sparse_apply(op),
                ("valid", "int64_extremes", "aliased", "empty", "mismatched"),
                ("raw", "wrapper"),
                "sparse_apply",
            )
            for op in ("SparseApplySgd", "SparseApplyAdagrad", "SparseApplyAdam")
        ),
        _spec(
            "StitchCombine", cs.gen_stitch_combine(False), FULL, ("raw", "wrapper", "native"), "stitch_combine", _STITCH
        ),
        _spec(
            "StitchCombineGrad",
            cs.gen_stitch_combine(True),
            FULL,
            ("raw", "wrapper", "native"),
            "stitch_combine_grad",
            _STITCH,
        ),
        _spec("StitchConcat", cs.gen_stitch_concat("concat"), FULL, ("raw", "wrapper"), "stitch_concat", _STITCH),
        _spec(
            "StitchConcatGrad",
            cs.gen_stitch_concat("concat_grad"),
            FULL,
            ("raw", "wrapper"),
            "stitch_concat_grad",
            _STITCH,
        ),
        _spec(
            "StitchConcatMatMul",
            cs.gen_stitch_concat("matmul"),
            FULL,
            ("raw", "wrapper"),
            "stitch_concat_matmul",
            _STITCH,
        ),
        _spec(
            "StitchConcatMatMulGrad",
            cs.gen_stitch_concat("matmul_grad"),
            FULL,
            ("raw", "wrapper"),
            "stitch_concat_matmul_grad",
            _STITCH,
        ),
        _spec("StitchFM", cs.gen_stitch_concat("fm"), FULL, ("raw", "wrapper"), "stitch_fm", _STITCH),
        _spec("StitchFMGrad", cs.gen_stitch_concat("fm_grad"), FULL, ("raw", "wrapper"), "stitch_fm_grad", _STITCH),
        _spec("Dice", cd.gen_dice(False), cd.CLASSES, ("raw", "wrapper"), "dice", _DICE),
        _spec("DiceGrad", cd.gen_dice(True), cd.CLASSES, ("raw", "wrapper"), "dice_grad", _DICE),
        _spec("UniquePartition", c.gen_unique_partition, FULL, ("raw", "wrapper", "native"), "unique_partition"),
        _spec("UniqueSubset", cs.gen_unique_subset, FULL, ("raw", "wrapper", "native"), "unique_subset"),
    )
}


def make_case(op: str, seed: int, index: int) -> c.Case:
    """Case `index` of `op` for `seed`: its class cycles through the op's classes."""
    spec = OPS[op]
    cls = spec.classes[index % len(spec.classes)]
    inputs, valid = spec.generate(c.rng_for(seed, op, index), cls)
    return c.Case(op, cls, bool(valid), inputs)

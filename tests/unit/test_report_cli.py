"""``python -m hybridtf.report --model <builder>`` and ``report(model)`` on a user's own model."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import tensorflow as tf

import hybridtf as htf
import hybridtf.report as htf_report
from hybridtf._src.report_cli import ModelSource, UsageError

USER_MODEL = textwrap.dedent(
    """
    import tensorflow as tf


    def build_model():
        user = tf.keras.Input(shape=(), dtype=tf.int64, name="user")
        item = tf.keras.Input(shape=(), dtype=tf.int64, name="item")
        tags = tf.keras.Input(shape=(None,), dtype=tf.int64, ragged=True, name="tags")
        numeric = tf.keras.Input(shape=(3,), name="numeric")
        u = tf.keras.layers.Embedding(100, 4, name="emb_user")(user)
        i = tf.keras.layers.Embedding(50, 4, name="emb_item")(item)
        t = tf.reduce_mean(tf.keras.layers.Embedding(30, 4, name="emb_tags")(tags), axis=1)
        c = tf.keras.layers.Embedding(
            20, 4, embeddings_constraint=tf.keras.constraints.NonNeg(), name="emb_constrained"
        )(item % 20)
        x = tf.keras.layers.Concatenate(name="concat")([u, i, t, c, numeric])
        h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(x)
        out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(h)
        return tf.keras.Model({"user": user, "item": item, "tags": tags, "numeric": numeric}, out, name="mine")


    def with_batch_norm():
        user = tf.keras.Input(shape=(), dtype=tf.int64, name="user")
        h = tf.keras.layers.BatchNormalization(name="bn")(tf.keras.layers.Embedding(100, 4, name="emb_user")(user))
        return tf.keras.Model(user, tf.keras.layers.Dense(1, name="out")(h))


    def not_a_model():
        return 42


    def needs_an_argument(fields):
        return build_model()
    """
)


@pytest.fixture()
def user_file(tmp_path):
    path = tmp_path / "user_model_for_report.py"
    path.write_text(USER_MODEL)
    return path


def _run(capsys, *argv):
    assert htf_report.main(list(argv)) == 0
    return capsys.readouterr().out


def test_model_source_parses_examples_and_builders():
    assert ModelSource.parse("wdl").example == "wdl"
    source = ModelSource.parse("my_pkg.my_mod:build_model")
    assert (source.example, source.module, source.function) == (None, "my_pkg.my_mod", "build_model")
    assert ModelSource.parse("dir/file.py:build").module == "dir/file.py"
    for bad in ("resnet", "mod:", ":build", "mod:not-an-identifier"):
        with pytest.raises(UsageError, match="neither a built-in example"):
            ModelSource.parse(bad)


def test_report_on_a_user_builder_from_a_file(user_file, capsys):
    out = _run(capsys, "--model", f"{user_file}:build_model", "--batch", "8", "--ranks", "2", "--json")
    d = json.loads(out)
    assert d["model_name"] == "mine" and d["optimized"]
    # before/after: the packed step has fewer ops, and no per-table Unique left for the packed tables
    assert d["ops"]["total"] < d["baseline_ops"]["total"]
    assert d["baseline_ops"]["by_type"]["Unique"] >= 3
    members = {m["name"] for t in d["plan"]["packed_tables"] for m in t["members"]}
    assert members == {"emb_user", "emb_item", "emb_tags"}
    skipped = {s["name"]: s["reason"] for s in d["skipped"]}
    assert set(skipped) == {"emb_constrained"} and "constraint" in skipped["emb_constrained"]
    assert d["fused_dense"] == ["hidden"]
    assert d["interleaving"] is not None and d["communication"]["num_ranks"] == 2
    assert d["config"]["model"].endswith(":build_model")


def test_under_horovodrun_only_rank_0_prints_the_report(user_file, capsys, monkeypatch):
    # horovodrun gives each process HOROVOD_RANK; the builder need not initialize Horovod
    args = ("--model", f"{user_file}:build_model", "--batch", "4", "--ranks", "0")
    monkeypatch.setenv("HOROVOD_RANK", "1")
    assert _run(capsys, *args) == ""
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert _run(capsys, *args).startswith("config: ")


def test_report_on_a_user_builder_by_module_name(user_file, capsys, monkeypatch):
    monkeypatch.chdir(user_file.parent)
    monkeypatch.syspath_prepend(str(user_file.parent))
    out = _run(capsys, "--model", "user_model_for_report:build_model", "--batch", "4", "--ranks", "0")
    assert "hybridtf report: model 'mine' (optimized by hybridtf)" in out
    assert "emb_constrained:" in out and "baseline" in out
    sys.modules.pop("user_model_for_report", None)


@pytest.mark.parametrize(
    "model, message",
    [
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        ("{file}:missing", "has no function 'missing'"),
        ("{file}:not_a_model", "returned int, not a tf.keras.Model"),
        ("{dir}/nope.py:build", "no file"),
        ("{file}:needs_an_argument", "the builder must take no arguments"),
    ],
)
def test_bad_model_argument_is_a_usage_error_naming_the_fix(user_file, capsys, model, message):
    with pytest.raises(SystemExit) as exit_info:
        htf_report.main(["--model", model.format(file=user_file, dir=user_file.parent), "--ranks", "0"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_module_whose_own_import_fails_shows_its_error_not_the_path_advice(tmp_path, capsys, monkeypatch):
    """Found but broken (it imports something missing): the user's ImportError, not "run from the directory"."""
    (tmp_path / "broken_builder_mod.py").write_text("import no_such_dependency_xyz\n\ndef build():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        htf_report.main(["--model", "broken_builder_mod:build", "--ranks", "0"])
    sys.modules.pop("broken_builder_mod", None)


def test_interleave_groups_below_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        htf_report.main(["--interleave-groups", "0", "--ranks", "0"])
    assert exit_info.value.code == 2
    assert "--interleave-groups must be >= 1" in capsys.readouterr().err


def _user_model():
    namespace = {}
    exec(USER_MODEL, namespace)  # the same builder the CLI loads
    return namespace["build_model"]()


def test_report_without_a_batch_uses_a_synthetic_batch_of_the_model_inputs():
    model = htf.keras.optimize(_user_model())
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    features, labels = htf_report.synthetic_batch(model, batch_size=6)
    assert set(features) == {"user", "item", "tags", "numeric"}
    assert isinstance(features["tags"], tf.RaggedTensor) and features["tags"].nrows() == 6
    assert features["numeric"].shape == (6, 3) and labels.shape == (6, 1)
    r = htf_report.report(model)
    assert r.optimized and r.baseline_ops is None
    assert r.ops == htf_report.count_ops(model, htf_report.synthetic_batch(model))  # the default batch: 256
    assert [s.name for s in r.skipped] == ["emb_constrained"]


def test_synthetic_batch_needs_a_built_model():
    class Subclassed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = tf.keras.layers.Embedding(10, 2)

        def call(self, ids):
            return self.emb(ids)

    model = Subclassed()  # never called: its inputs are unknown
    with pytest.raises(ValueError, match="never been built or called"):
        htf_report.synthetic_batch(model)


DYNAMIC_MODEL = textwrap.dedent(
    """
    import tensorflow as tf
    import hybridtf as htf


    def build_model():
        ids = {n: tf.keras.Input((1,), dtype=tf.int64, name=n) for n in ("a", "b", "c")}
        parts = [tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(8, name=f"d{n}")(ids[n])) for n in "ab"]
        parts.append(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(100, 8, name="static")(ids["c"])))
        out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(parts))
        return tf.keras.Model(ids, out, name="dyn")
    """
)


def test_report_on_an_uncompiled_model_with_dynamic_tables_on_two_ranks(tmp_path, capsys):
    """The flags' optimizer is hooked for the dynamic tables; their traffic is estimated by id owner."""
    path = tmp_path / "dynamic_model_for_report.py"
    path.write_text(DYNAMIC_MODEL)
    d = json.loads(_run(capsys, "--model", f"{path}:build_model", "--batch", "8", "--ranks", "2", "--json"))
    tables = d["communication"]["tables"]
    (store,) = [name for name, t in tables.items() if t["placement"] == "sharded by id (dynamic)"]
    assert sum(tables[store]["unique_ids_per_rank"]) > 0
    assert all(r["alltoall_bytes"] > 0 for r in d["communication"]["per_rank"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--optimizer", "bogus"], "--optimizer 'bogus' is not a Keras optimizer name"),
        (["--loss", "bogus"], "--loss 'bogus' is not a Keras loss name"),
        (["--micro-batches", "0"], "--micro-batches must be >= 1"),
        (["--ranks", "-1"], "--ranks must be >= 0"),
        # were tracebacks (a probe): the default batch of 256 on 3 ranks, and sizes nothing can hold
        (["--ranks", "3"], "--batch 256 must be divisible by --ranks 3 (each rank traces an equal share"),
        (["--ranks", str(2**40)], "--ranks 1099511627776 exceeds --batch 256"),
        (["--batch", str(2**70)], "--batch must be in [1, 16777216]"),
    ],
)
def test_bad_flags_are_usage_errors(user_file, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        htf_report.main(["--model", f"{user_file}:build_model", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_training_flags_of_a_built_in_example_are_usage_errors(capsys):
    """The examples train with the benchmark's Adagrad: --optimizer / --loss are refused, not silently ignored."""
    with pytest.raises(SystemExit) as exit_info:
        htf_report.main(["--model", "wdl", "--optimizer", "adam"])
    assert exit_info.value.code == 2
    assert "--optimizer set the training of a user model" in capsys.readouterr().err


def test_model_none_without_the_dynamic_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        htf_report.main(["--model", "none"])
    assert exit_info.value.code == 2
    assert "add --dynamic STEPS" in capsys.readouterr().err


def test_a_model_hybridtf_refuses_with_the_options_is_an_error_line_not_a_traceback(user_file, capsys):
    status = htf_report.main(["--model", f"{user_file}:with_batch_norm", "--batch", "8", "--micro-batches", "2"])
    err = capsys.readouterr().err
    assert status == 1
    assert "error: InterleavingError: layer 'bn' is a BatchNormalization" in err
    assert "Traceback" not in err

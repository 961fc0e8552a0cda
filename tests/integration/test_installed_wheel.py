"""The built wheel, installed into a fresh venv, works from a directory outside the checkout.

Builds the wheel with ``pip wheel --no-deps --no-build-isolation``, in the same ``HYBRIDTF_CUDA``
mode as ``./dev.sh setup`` (the environment's, default auto: with CUDA when nvcc is found), so the
checkout's ``build/`` object cache of that set-up makes it a link only (a CPU-only wheel after a
CUDA set-up compiled every kernel again: ~90 s of one core in a fresh clone's CI). Built once per
test session (``tests/once.py``: two pytest-xdist workers building in ``build/`` at once break each
other's build). Creates a fresh venv and installs the wheel into it with pip. The venv reaches the
shared stack (TensorFlow, Keras, NumPy) through a ``.pth`` file naming the running interpreter's
site-packages: ``venv --system-site-packages`` would expose the
*base* interpreter's site-packages, which is not where the stack is installed when the tests run
from a venv. A ``.pth`` path is added without processing that directory's own ``.pth`` files, so
an editable hybridtf installed there stays invisible; the test checks that ``hybridtf`` is
imported from the new venv. Then, with the checkout off ``sys.path`` and the working directory
elsewhere: ``import hybridtf``, ``python -m hybridtf.report --model wdl``, the same command on a
model defined in a temporary file (as ``module:builder`` and as ``file.py:builder``), and a tiny
``optimize`` + ``fit`` that must match the plain model.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from tests.once import computed_once

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_installed_wheel")]

USER_MODEL = textwrap.dedent(
    """
    import tensorflow as tf


    def build_model():
        user = tf.keras.Input(shape=(), dtype=tf.int64, name="user")
        item = tf.keras.Input(shape=(), dtype=tf.int64, name="item")
        u = tf.keras.layers.Embedding(100, 4, name="emb_user")(user)
        i = tf.keras.layers.Embedding(50, 4, name="emb_item")(item)
        h = tf.keras.layers.Dense(4, activation="relu", name="hidden")(tf.keras.layers.Concatenate()([u, i]))
        out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(h)
        return tf.keras.Model({"user": user, "item": item}, out, name="users_model")
    """
)

SMOKE = textwrap.dedent(
    """
    import importlib.metadata, json, sys
    import numpy as np
    import tensorflow as tf
    import hybridtf as htf
    from user_model import build_model

    rng = np.random.default_rng(0)
    x = {"user": rng.integers(0, 100, 64), "item": rng.integers(0, 50, 64)}
    y = rng.integers(0, 2, (64, 1)).astype("float32")
    losses = {}
    for name in ("plain", "hybridtf"):
        tf.keras.utils.set_random_seed(1)
        model = build_model()
        if name == "hybridtf":
            model = htf.keras.optimize(model)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
        losses[name] = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history["loss"]
        packed = len(model.hybridtf_plan.packed_tables) if name == "hybridtf" else 0
    print(json.dumps({
        "file": htf.__file__, "version": htf.__version__, "dist_version": importlib.metadata.version("hybridtf"),
        "losses": losses, "packed": packed,
    }))
    """
)


def _run(cmd, cwd, env, timeout=900):
    result = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(venv python, clean env)`` with the freshly built wheel installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    tmp = computed_once(tmp_path_factory, "installed_wheel", lambda tmp: _build_and_install(tmp, env))
    venv = tmp / "venv"
    return venv / "bin" / "python", env, venv, tmp / "elsewhere"


def _build_and_install(tmp, env):
    wheels = tmp / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, ROOT],
        cwd=ROOT,
        env=env,
    )
    (wheel,) = wheels.glob("hybridtf-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp, env=env)
    python = venv / "bin" / "python"
    site = pathlib.Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env))
    stack = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (pathlib.Path(site.as_posix().strip()) / "shared_stack.pth").write_text("\n".join(sorted(stack)) + "\n")
    # pip comes from the shared stack too; --ignore-installed: never touch a hybridtf found there
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel], cwd=tmp, env=env)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "user_model.py").write_text(USER_MODEL)


def test_import_and_a_tiny_optimize_from_the_installed_wheel(installed):
    python, env, venv, elsewhere = installed
    (elsewhere / "smoke.py").write_text(SMOKE)
    out = json.loads(_run([python, "smoke.py"], cwd=elsewhere, env=env).splitlines()[-1])
    assert pathlib.Path(out["file"]).resolve().is_relative_to(venv.resolve())
    assert not pathlib.Path(out["file"]).resolve().is_relative_to(ROOT)
    assert out["version"] == out["dist_version"]
    assert out["packed"] == 1  # one packed table: the installed op library ran the packed chain
    plain, packed = out["losses"]["plain"], out["losses"]["hybridtf"]
    assert abs(plain[0] - packed[0]) <= 1e-5 * abs(plain[0])


def test_report_on_the_builtin_example(installed):
    python, env, _, elsewhere = installed
    cmd = [python, "-m", "hybridtf.report", "--model", "wdl", "--batch", "32", "--ranks", "0", "--json"]
    d = json.loads(_run(cmd, cwd=elsewhere, env=env).splitlines()[-1])
    assert d["optimized"] and d["config"]["model"] == "wdl"
    assert d["ops"]["total"] < d["baseline_ops"]["total"]
    assert sum(len(t["members"]) for t in d["plan"]["packed_tables"]) == 52  # 26 deep + 26 wide tables


@pytest.mark.parametrize("spec", ["user_model:build_model", "{dir}/user_model.py:build_model"])
def test_report_on_a_model_defined_in_a_file(installed, spec):
    python, env, _, elsewhere = installed
    cmd = [python, "-m", "hybridtf.report", "--model", spec.format(dir=elsewhere), "--batch", "8", "--ranks", "0"]
    out = _run(cmd, cwd=elsewhere, env=env)
    assert "hybridtf report: model 'users_model' (optimized by hybridtf)" in out
    assert "emb_user@0, emb_item@100" in out

"""Saved models holding hybridtf's layers and optimizers load in a new process after ``import hybridtf``.

``import hybridtf`` keeps TensorFlow out until it is used, yet Keras must know hybridtf's registered
classes (``hybridtf>EmbeddingBag``, ``hybridtf>DynamicEmbedding``, ``hybridtf>DynamicAdam``) to load a
``.keras`` file: they are registered as soon as TensorFlow is imported, whichever is imported first. A
SavedModel directory's DynamicEmbedding is revived from its saved functions (the static lookup of the
learned rows), with hybridtf imported or not.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAVE = """
import sys, numpy as np, tensorflow as tf, hybridtf as htf
out = sys.argv[1]
user = tf.keras.Input((1,), dtype=tf.int64, name="user")
hist = tf.keras.Input((None,), ragged=True, dtype=tf.int64, name="hist")
x = tf.keras.layers.Concatenate()([
    tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(4, name="user_dyn")(user)),
    htf.layers.EmbeddingBag(50, 4, combiner="mean", name="hist_bag")(hist),
])
model = tf.keras.Model({"user": user, "hist": hist}, tf.keras.layers.Dense(1)(x))
model.compile(htf.keras.dynamic_optimizer(tf.keras.optimizers.Adam(0.01)), "mse")
rng = np.random.default_rng(0)
hist_ids = tf.ragged.constant([[i % 50, (3 * i) % 50] for i in range(16)], tf.int64)
batch = {"user": rng.integers(-2**62, 2**62, (16, 1)), "hist": hist_ids}
for _ in range(3):
    model.train_on_batch(batch, np.ones((16, 1)))
model.save(out + "/m.keras")
model.save(out + "/m_dir")
np.save(out + "/pred.npy", model.predict(batch, verbose=0))
np.save(out + "/user.npy", batch["user"])
"""

LOAD = """
import sys, numpy as np
{imports}
out, path = sys.argv[1], sys.argv[2]
user = np.load(out + "/user.npy")
batch = {{"user": user, "hist": tf.ragged.constant([[i % 50, (3 * i) % 50] for i in range(16)], tf.int64)}}
model = tf.keras.models.load_model(out + "/" + path)
np.save(out + "/pred_" + sys.argv[3] + ".npy", model.predict(batch, verbose=0))
"""


def _python(code, *args):
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-c", code, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved")
    _python(SAVE, str(out))
    return out


@pytest.mark.parametrize("path", ["m.keras", "m_dir"])
@pytest.mark.parametrize(
    "imports",
    [
        "import hybridtf, tensorflow as tf",
        "import tensorflow as tf, hybridtf",
        # the stand-alone keras package imports TensorFlow half way through its own import
        "import hybridtf, keras, tensorflow as tf",
        # an availability check finds TensorFlow's spec without importing it
        "import hybridtf, importlib.util; importlib.util.find_spec('tensorflow'); import tensorflow as tf",
        # a hybridtf module that imports TensorFlow at its top is the first use (half initialized meanwhile)
        "import hybridtf; hybridtf.ops.unique_partition([5, 3], num_partitions=2); import tensorflow as tf",
    ],
)
def test_a_saved_model_with_hybridtf_layers_loads_in_a_new_process_after_import_hybridtf(saved, path, imports):
    tag = f"{path}_{abs(hash(imports))}"
    _python(LOAD.format(imports=imports), str(saved), path, tag)
    np.testing.assert_allclose(np.load(saved / f"pred_{tag}.npy"), np.load(saved / "pred.npy"), rtol=1e-6)

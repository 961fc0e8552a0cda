"""A loop that builds, trains and drops optimized models (a hyperparameter search) frees each one.

In a graph ``tf.custom_gradient`` registers its gradient function in TensorFlow's process-wide
registry for good, and that function holds the traced step: hybridtf's fused field sum and clipping
norms, and Keras's aggregation of the dense gradients (all of an optimized model's gradients that
Keras sees are dense), kept every trained model's step alive with its tables and slots (a probe's
loop grew by 260 MB per model). ``gradient_registry`` leaves those functions to their graph.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import gc, json, logging
import numpy as np, tensorflow as tf, hybridtf as htf
from tensorflow.python.framework import ops

logging.getLogger("hybridtf").setLevel(logging.ERROR)
F, V = 6, 50


def build(kind):
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(F)]
    if kind == "dynamic":
        deep = [tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(4)(x)) for x in inputs]
        return tf.keras.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(tf.keras.layers.Concatenate()(deep)))
    deep = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(V, 4)(x)) for x in inputs]
    wide = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(V, 1)(x)) for x in inputs]
    head = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(8, "relu")(tf.keras.layers.Concatenate()(deep)))
    return tf.keras.Model(inputs, tf.keras.layers.Activation("sigmoid")(head + tf.keras.layers.Add()(wide)))


def step_ops():
    return sum(1 for o in gc.get_objects() if type(o) is ops.Operation and o.graph.name == "train_function")


rng = np.random.default_rng(0)
x = {f"f{i}": rng.integers(0, V, (64, 1)) for i in range(F)}
y = rng.integers(0, 2, (64, 1)).astype("float32")
OPTIMIZERS = {
    "static": lambda: tf.keras.optimizers.Adagrad(0.1),
    "clipped": lambda: tf.keras.optimizers.Adagrad(0.1, clipnorm=0.5),
    "dynamic": lambda: htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.1)),
}


def custom_gradients():  # tf.custom_gradient's registrations (op gradients register once, at import)
    return sum(1 for name in ops._gradient_registry.list() if name.startswith("CustomGradient"))


registered = custom_gradients()
seen = {}
for kind, optimizer in OPTIMIZERS.items():
    for _ in range(2):
        model = htf.keras.optimize(build(kind))
        model.compile(optimizer(), "binary_crossentropy")
        model.fit(x, y, batch_size=32, verbose=0)
        del model
        tf.keras.backend.clear_session()
        gc.collect()
    seen[kind] = step_ops()
seen["registry"] = custom_gradients() - registered


def model_fn(features, labels, mode):
    outs = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(V, 4)(features[f"f{i}"])) for i in range(F)]
    loss = tf.reduce_mean(tf.square(tf.keras.layers.Dense(1)(tf.concat(outs, 1)) - labels))
    step = tf.compat.v1.train.get_global_step()
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


for _ in range(2):  # an Estimator's graphs (wrapped model_fn) are gone with it
    estimator = tf.estimator.Estimator(htf.estimator.model_fn(model_fn))
    estimator.train(lambda: tf.data.Dataset.from_tensors((x, y)).repeat(2), steps=2)
    del estimator
    gc.collect()
seen["estimator"] = sum(1 for o in gc.get_objects() if type(o) is ops.Operation and type(o.graph) is ops.Graph)
print(json.dumps(seen))
"""


def test_trained_optimized_models_are_freed_with_their_steps():
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-c", SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    live = json.loads(proc.stdout.strip().splitlines()[-1])
    # ops of dropped models' traced steps and Estimators' graphs; gradient functions registered
    assert live == {"static": 0, "clipped": 0, "dynamic": 0, "registry": 0, "estimator": 0}, live

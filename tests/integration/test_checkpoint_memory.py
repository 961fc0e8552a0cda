"""Saving and loading an optimized model holds each packed variable's rows about once, not once per table.

Each table's checkpoint entry is its row range of the packed variable. Read as a slice, every entry read
the whole packed variable first, which TensorFlow copies once a sparse op has touched the variable: a
checkpoint of N tables packed together held N copies of it (a probe's 10M-row packed table of 28 tables
reached 22.7 GB in ``save_weights``). Entries are now gathered rows. Measured in a fresh process (peak RSS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import json, resource, sys
import numpy as np, tensorflow as tf, hybridtf as htf

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

small = 16
inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(small + 1)]
outs = [
    tf.keras.layers.Flatten()(tf.keras.layers.Embedding(2_000_000 if i == 0 else 100, 16, name=f"e{i}")(x))
    for i, x in enumerate(inputs)
]
model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()(outs)))
if sys.argv[2] == "optimized":
    model = htf.keras.optimize(model)
model.compile(tf.keras.optimizers.Adagrad(0.1), "mse")
model.train_on_batch({f"f{i}": np.zeros((8, 1), np.int64) for i in range(small + 1)}, np.ones((8, 1)))
before = rss()
model.save_weights(sys.argv[1] + "/w")
saved = peak()
model.load_weights(sys.argv[1] + "/w")
print(json.dumps({"before": before, "save_peak": saved, "load_peak": peak()}))
"""


def _measure(directory, kind):
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-c", SCRIPT, str(directory), kind]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_saving_and_loading_hold_the_packed_rows_about_once(tmp_path):
    plain, optimized = _measure(tmp_path / "plain", "plain"), _measure(tmp_path / "optimized", "optimized")
    table = 2_000_000 * 16 * 4 / 2**20  # 122 MiB, and as much again for Adagrad's accumulator
    # About one more copy of the rows and of the slot than the plain model (before: 17 copies of each).
    for step in ("save", "load"):
        grown = {kind: mb[f"{step}_peak"] - mb["before"] for kind, mb in (("plain", plain), ("optimized", optimized))}
        assert grown["optimized"] < grown["plain"] + 3 * table, (step, grown)


def test_estimator_saver_reads_a_packed_variable_once_for_all_of_its_tables(tmp_path):
    """The Estimator's Saver slices every table's entry from one read of the packed variable.

    Once a sparse op touched the variable, each read copies it whole: read per entry, saving N
    tables packed together held N copies while the checkpoint was written (a 122 MiB variable of 16
    tables: the save grew the process by 2,082 MB; from one read, by 139 MB).
    """
    from hybridtf._src.integrations.estimator_saver import PackedSaveable

    members = [(f"t{i}/embeddings", 100 * i, 100) for i in range(17)]
    rows = np.arange(1700 * 4, dtype=np.float32).reshape(1700, 4)
    with tf.Graph().as_default() as graph:
        variable = tf.Variable(rows, name="packed")
        touched = tf.raw_ops.ResourceGather(resource=variable.handle, indices=[3], dtype=tf.float32)
        saver = tf.compat.v1.train.Saver([PackedSaveable(variable, members)])
        (save,) = [op for op in graph.get_operations() if op.type == "SaveV2"]
        reads, todo, seen = [], [save], set()
        while todo:  # the ops the save runs
            op = todo.pop()
            if op.name not in seen:
                seen.add(op.name)
                reads += [op] if op.type == "ReadVariableOp" else []
                todo += [t.op for t in op.inputs] + list(op.control_inputs)
        assert len(reads) == 1, [op.name for op in reads]
        with tf.compat.v1.Session() as sess:
            sess.run(variable.initializer)
            sess.run(touched)  # the variable is now copied on every read
            path = saver.save(sess, str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    for key, offset, num in members:
        np.testing.assert_array_equal(reader.get_tensor(key), rows[offset : offset + num])


DYNAMIC_SCRIPT = """
import json, sys
import numpy as np, tensorflow as tf, hybridtf as htf

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

ids = tf.keras.Input((1,), dtype=tf.int64)
layer = htf.layers.DynamicEmbedding(32, hot_rows=1000, name="user")
model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
model.compile(optimizer=htf.keras.dynamic_optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="mse")
batch = 250_000
for i in range(int(sys.argv[2]) // batch):
    x = np.arange(i * batch, (i + 1) * batch, dtype=np.int64)[:, None] * 7919 + 3
    model.train_on_batch(x, np.zeros((batch, 1), np.float32))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the current RSS
before = status("VmRSS")
model.save_weights(sys.argv[1] + "/w")
print(json.dumps({"rows": layer.stats()["size"], "grown": status("VmHWM") - before}))
"""


def test_saving_a_dynamic_table_holds_its_rows_once_more_not_twice(tmp_path):
    """A HybridHash export copied the table into vectors, then into the output tensors: a save of a dynamic
    table peaked at twice its rows and slots (2M rows of dim 32 with Adagrad: +1,036 MB for 512 MB of rows
    and slots); the export now writes into the output tensors (+518 MB)."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs /proc/self/clear_refs to reset the peak RSS")
    rows = 1_000_000
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-c", DYNAMIC_SCRIPT, str(tmp_path), str(rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["rows"] == rows
    data = rows * 32 * 2 * 4 / 2**20  # rows + Adagrad accumulators: 244 MiB
    assert measured["grown"] < 1.4 * data, measured

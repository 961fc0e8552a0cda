"""SIGKILL during per-step checkpointing: the newest complete checkpoint always loads, with its predictions.

A child process trains an optimized model (hybridtf) and checkpoints after every step by one of
three paths:

* ``save_weights``: a loop of ``train_on_batch`` + ``model.save_weights(<dir>/ckpt/w)``;
* ``modelcheckpoint``: ``model.fit`` with ``ModelCheckpoint(save_weights_only=True, save_freq=1)``;
* ``estimator``: ``tf.estimator.Estimator(hybridtf.estimator.model_fn(...))`` with
  ``save_checkpoints_steps=1`` (its Saver is hybridtf's ``CrashSafeSaver``).

Before each save the child writes the predictions of the state it is about to save on a fixed
evaluation batch to ``<dir>/preds/<step>.npy`` (atomically) and prints ``S <step>``; after the save it
prints ``E <step>``. It resumes from the newest checkpoint when started again.

The parent starts the child, waits for its first completed save, kills it with SIGKILL at a random
moment (fixed seed), then loads the newest complete checkpoint into a fresh model (the state file's,
read by hybridtf's ``load_weights`` / the Estimator) and checks that its predictions equal the ones
recorded for its step and that no ``*_temp`` directory is left; then it starts the child again
(which resumes, so kills also land in saves that overwrite the newest checkpoint). Full run::

    PYTHONPATH=. python tests/integration/kill_checkpoint.py --path save_weights --kills 50
    PYTHONPATH=. python tests/integration/kill_checkpoint.py --path modelcheckpoint --kills 50
    PYTHONPATH=. python tests/integration/kill_checkpoint.py --path estimator --kills 50

It prints one JSON line: kills, kills that landed inside a save, checkpoints loaded and matched.
``--dynamic`` gives the Keras model DynamicEmbedding fields (one packed store, no static table).
``--plain`` runs the plain Keras model (no hybridtf) for reference: a kill that leaves its newest
checkpoint unreadable or wrong is reported under ``failed`` (the next child starts afresh).
``tests/integration/test_checkpoint_crash.py`` runs a few kills of each path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

FIELDS, VOCAB, DIM, BATCH, N_DENSE = 6, 500, 8, 64, 3
PATHS = ("save_weights", "modelcheckpoint", "estimator")


# --------------------------------------------------------------------------- data and models


def _data(seed: int, n: int = BATCH):
    rng = np.random.default_rng(seed)
    x = {f"C{i}": rng.integers(0, VOCAB, size=(n,)).astype(np.int64) for i in range(FIELDS)}
    x["dense_in"] = rng.normal(size=(n, N_DENSE)).astype(np.float32)
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    return x, y


EVAL_X, _ = _data(seed=12345)


def _keras_model(plain: bool = False, dynamic: bool = False):
    """The W&D-style model; ``dynamic``: its fields are DynamicEmbedding layers (``optimize`` packs them into one
    store and no static table: the model class of an optimize without static packing)."""
    import tensorflow as tf

    import hybridtf as htf

    inputs = {f"C{i}": tf.keras.Input((), dtype=tf.int64, name=f"C{i}") for i in range(FIELDS)}
    inputs["dense_in"] = tf.keras.Input((N_DENSE,), name="dense_in")
    init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=1)

    def embedding(i):
        if dynamic:
            return htf.layers.DynamicEmbedding(DIM, seed=i, warmup_steps=2, flush_every=3, name=f"emb_C{i}")
        return tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=init, name=f"emb_C{i}")

    deep = [embedding(i)(inputs[f"C{i}"]) for i in range(FIELDS)]
    h = tf.keras.layers.Concatenate()([*deep, inputs["dense_in"]])
    h = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(2))(h)
    out = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
    model = tf.keras.Model(inputs, out)
    if not plain:
        model = htf.keras.optimize(model)
    optimizer = tf.keras.optimizers.Adagrad(0.05)
    model.compile(
        optimizer=htf.keras.dynamic_optimizer(optimizer) if dynamic else optimizer, loss="binary_crossentropy"
    )
    return model


def _estimator_model_fn(features, labels, mode):
    import tensorflow as tf

    init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=1)
    embs = [tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=init, name=f"emb_C{i}") for i in range(FIELDS)]
    dense1 = tf.keras.layers.Dense(16, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    dense2 = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(3))

    def net(f):
        return tf.sigmoid(dense2(dense1(tf.concat([e(f[f"C{i}"]) for i, e in enumerate(embs)] + [f["dense_in"]], 1))))

    pred = net(features)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    # The predictions on the evaluation batch, read by the recorder before each save. Fed by
    # placeholders with defaults, their lookups run on their own (never with the input pipeline's).
    eval_x = {k: tf.compat.v1.placeholder_with_default(v, v.shape) for k, v in EVAL_X.items()}
    tf.compat.v1.add_to_collection("kill_checkpoint_eval", net(eval_x))
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, pred))
    opt = tf.compat.v1.train.AdagradOptimizer(0.05)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    )


def _estimator(model_dir):
    import tensorflow as tf

    import hybridtf as htf

    config = tf.estimator.RunConfig(
        tf_random_seed=1,
        save_checkpoints_steps=1,
        keep_checkpoint_max=2,
        save_summary_steps=None,
        log_step_count_steps=None,
    )
    return tf.estimator.Estimator(htf.estimator.model_fn(_estimator_model_fn), model_dir=model_dir, config=config)


def _save_npy(path, value):
    tmp = f"{path}.tmp{os.getpid()}.npy"
    np.save(tmp, value)
    os.replace(tmp, path)


def _say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- child


def child(path: str, directory: str, plain: bool = False, dynamic: bool = False) -> None:
    import tensorflow as tf

    preds_dir = os.path.join(directory, "preds")
    os.makedirs(preds_dir, exist_ok=True)
    batches = [_data(seed=s) for s in range(8)]
    if path == "estimator":
        est = _estimator(os.path.join(directory, "est"))

        class Recorder(tf.estimator.CheckpointSaverListener):
            def before_save(self, session, global_step_value):
                pred = session.run(tf.compat.v1.get_collection("kill_checkpoint_eval")[0])
                _save_npy(os.path.join(preds_dir, f"{int(global_step_value)}.npy"), pred)
                _say(f"S {int(global_step_value)}")

            def after_save(self, session, global_step_value):
                _say(f"E {int(global_step_value)}")

        def input_fn():
            xs = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
            ys = np.concatenate([b[1] for b in batches])
            return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH).repeat()

        est.train(input_fn, steps=10**9, saving_listeners=[Recorder()])
        return

    model = _keras_model(plain, dynamic)
    prefix = os.path.join(directory, "ckpt", "w")
    if tf.io.gfile.exists(os.path.join(directory, "ckpt", "checkpoint")):
        model.load_weights(prefix)  # resumes from the newest complete checkpoint

    def record():
        step = int(model.optimizer.iterations.numpy())
        _save_npy(os.path.join(preds_dir, f"{step}.npy"), model(EVAL_X, training=False).numpy())
        _say(f"S {step}")
        return step

    if path == "save_weights":
        while True:
            for x, y in batches:
                model.train_on_batch(x, y)
                step = record()
                model.save_weights(prefix)
                _say(f"E {step}")

    class Before(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.step = record()

    class After(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            _say(f"E {before.step}")

    before = Before()
    xs = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
    ys = np.concatenate([b[1] for b in batches])
    checkpoint = tf.keras.callbacks.ModelCheckpoint(prefix, save_weights_only=True, save_freq=1)
    model.fit(xs, ys, batch_size=BATCH, epochs=10**6, verbose=0, shuffle=False, callbacks=[before, checkpoint, After()])


# --------------------------------------------------------------------------- parent


def _temp_dirs(directory):
    found = []
    for root, dirs, _ in os.walk(directory):
        found += [os.path.join(root, d) for d in dirs if "_temp" in d]
    return found


def check(path: str, directory: str, plain: bool = False, dynamic: bool = False) -> int:
    """Loads the newest complete checkpoint; asserts its predictions equal the recorded ones. Returns its step."""
    import tensorflow as tf

    if path == "estimator":
        model_dir = os.path.join(directory, "est")
        latest = tf.train.latest_checkpoint(model_dir)
        step = int(tf.train.load_variable(latest, "global_step"))
        est = _estimator(model_dir)
        ds = lambda: tf.data.Dataset.from_tensor_slices(EVAL_X).batch(BATCH)  # noqa: E731
        got = np.stack([p["p"] for p in est.predict(ds, yield_single_examples=True)])
    else:
        model = _keras_model(plain, dynamic)
        model.optimizer.build(model.trainable_variables)  # its slots are restored (and read) too
        model.load_weights(os.path.join(directory, "ckpt", "w"))
        step = int(model.optimizer.iterations.numpy())
        got = model(EVAL_X, training=False).numpy()
    want = np.load(os.path.join(directory, "preds", f"{step}.npy"))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"checkpoint of step {step}")
    left = _temp_dirs(directory)
    assert not left, f"temporary directories left after loading: {left}"
    return step


def run(
    path: str,
    kills: int,
    seed: int = 0,
    directory: str | None = None,
    max_delay: float = 1.5,
    plain: bool = False,
    dynamic: bool = False,
) -> dict:
    """Kills the child ``kills`` times at random moments; checks the newest checkpoint after each kill.

    With ``plain`` (a reference run of the plain Keras model, without hybridtf), a checkpoint that
    does not load or predict as recorded is counted (``failed``) instead of raising.
    """
    rng = np.random.default_rng(seed)
    directory = directory or tempfile.mkdtemp(prefix=f"kill_{path}_")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_repo_root(), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    in_save, steps, failed = 0, [], []
    for k in range(kills):
        command = [sys.executable, os.path.abspath(__file__), "--child", "--path", path, "--dir", directory]
        command += ["--dynamic"] if dynamic else []
        proc = subprocess.Popen(
            [*command, "--plain"] if plain else command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        last = _wait_for_first_save(proc)
        delay = rng.uniform(0.0, max_delay)
        deadline = time.monotonic() + delay
        os.set_blocking(proc.stdout.fileno(), False)
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        lines = [line for line in (proc.stdout.read() or "").splitlines() if line[:2] in ("S ", "E ")]
        last = lines[-1] if lines else last
        proc.stdout.close()
        in_save += last.startswith("S ")
        try:
            steps.append(check(path, directory, plain, dynamic))
        except Exception as e:  # counted for the plain reference, raised otherwise
            if not plain:
                raise
            failed.append(f"kill {k + 1} ({last}): {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}")
            shutil.rmtree(os.path.join(directory, "ckpt"), ignore_errors=True)  # it cannot resume: start over
            print(f"kill {k + 1}/{kills}: {last}, FAILED {failed[-1]}", file=sys.stderr, flush=True)
            continue
        print(f"kill {k + 1}/{kills}: {last}, newest checkpoint step {steps[-1]} ok", file=sys.stderr, flush=True)
    return {
        "path": path,
        "model": ("plain" if plain else "hybridtf") + (" dynamic" if dynamic else ""),
        "kills": len(steps) + len(failed),
        "kills_inside_a_save": in_save,
        "loaded_and_matched": len(steps),
        "failed": failed,
        "steps": steps,
        "dir": directory,
    }


def _wait_for_first_save(proc) -> str:
    for line in proc.stdout:
        if line.startswith("E "):
            return line.strip()
    raise RuntimeError(f"the child exited (code {proc.wait()}) before its first checkpoint")


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", choices=PATHS, required=True)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--plain", action="store_true", help="reference: the plain Keras model, without hybridtf")
    parser.add_argument("--dynamic", action="store_true", help="DynamicEmbedding fields (Keras paths)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.path, args.dir, args.plain, args.dynamic)
        return
    start = time.monotonic()
    if args.dynamic and args.path == "estimator":
        parser.error("--dynamic is for the Keras paths (save_weights, modelcheckpoint)")
    result = run(args.path, args.kills, args.seed, args.dir, plain=args.plain, dynamic=args.dynamic)
    result["seconds"] = round(time.monotonic() - start, 1)
    del result["steps"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()

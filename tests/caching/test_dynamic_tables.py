"""Dynamic tables in the functional API (``Tables`` + ``DynamicTableConfig``): exact custom loops, checkpoints, errors.

The backbone: a custom loop under ``hybridtf.function`` (and plain eager)
whose ``Tables`` hold a dynamic table gives the same per-step losses (1e-5
relative, fp32) as the same loop whose table is a fixed-vocabulary
``TableConfig`` initialized to the dynamic table's deterministic per-id rows,
with Algorithm 1's flushes during the run.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf.embedding import DynamicTableConfig, TableConfig, Tables

V, D, BATCH, SEED, STEPS = 64, 4, 32, 77, 40
DYN = dict(hot_rows=16, warmup_steps=5, flush_every=7, seed=SEED)


def _data(steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1) ** 1.1
    ids = rng.choice(V, size=(steps, BATCH, 2), p=p / p.sum()).astype(np.int64)
    ctx = rng.integers(0, 10, size=(steps, BATCH)).astype(np.int64)
    y = rng.normal(size=(steps, BATCH, 1)).astype(np.float32)
    return ids, ctx, y


def _init_rows():
    tables = Tables([DynamicTableConfig("items", D, **DYN)])
    return tables.lookup("items", tf.range(V, dtype=tf.int64), training=False).numpy()


def _loop(dynamic, kind, decorate, micro_batches=1, split=False):
    ctx_init = np.linspace(-0.1, 0.1, 10 * D, dtype=np.float32).reshape(10, D)
    items = DynamicTableConfig("items", D, **DYN) if dynamic else TableConfig("items", V, D, initializer=_init_rows())
    tables = Tables([items, TableConfig("ctx", 10, D, initializer=ctx_init)])
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(4))
    dense.build((None, 3 * D))
    opt = tf.keras.optimizers.Adagrad(0.1) if kind == "adagrad" else tf.keras.optimizers.Adam(0.01)
    if dynamic:
        opt = htf.keras.dynamic_optimizer(opt)

    def loss_fn(batch):
        ids, ctx, y = batch
        if split:  # one lookup per field: the step fills the table's buffer twice
            e = tf.concat([tables.lookup("items", ids[:, f], training=True) for f in range(2)], axis=1)
        else:
            e = tf.reshape(tables.lookup("items", ids, training=True), [-1, 2 * D])
        h = tf.concat([e, tables.lookup("ctx", ctx)], axis=1)
        return tf.reduce_mean(tf.square(dense(h) - y))

    def step(ids, ctx, y):
        variables = [*tables.trainable_variables, *dense.trainable_variables]
        if micro_batches > 1:
            loss, grads = htf.micro_batch_gradients(loss_fn, (ids, ctx, y), variables, micro_batches=micro_batches)
        else:
            with tf.GradientTape() as tape:
                loss = loss_fn((ids, ctx, y))
            grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    step = decorate(step)
    step.checkpoint = tf.train.Checkpoint(tables=tables, dense=dense, optimizer=opt)
    return tables, step


def _run(step, data, first=0, steps=STEPS):
    ids, ctx, y = data
    return np.array([float(step(ids[i], ctx[i], y[i])) for i in range(first, first + steps)])


@pytest.mark.parametrize(
    "kind, decorate",
    [("adagrad", htf.function), ("adam", htf.function), ("adagrad", tf.autograph.experimental.do_not_convert)],
)
def test_custom_loop_with_dynamic_table_equals_fixed_table(kind, decorate):
    data = _data()
    tables, step = _loop(True, kind, decorate)
    _, plain = _loop(False, kind, decorate)
    np.testing.assert_allclose(_run(step, data), _run(plain, data), rtol=1e-5)
    s = tables.dynamic_tables["items"].stats()
    assert s["size"] == len(np.unique(data[0])) and s["step"] == STEPS and s["hot_used"] == 16
    assert s["flushes"] == len([i for i in range(STEPS) if i >= 5 and i % 7 == 0]) and 0 < s["hits"] < s["lookups"]


@pytest.mark.parametrize(
    "kind, decorate", [("adagrad", htf.function), ("adam", tf.autograph.experimental.do_not_convert)]
)
def test_micro_batch_gradients_over_a_dynamic_table_equal_the_whole_batch(kind, decorate):
    """Each micro-batch's lookup appends its rows to the table's buffer; the update sums them per distinct id."""
    data = _data(steps=12)
    tables, step = _loop(True, kind, decorate, micro_batches=3)
    whole_tables, whole = _loop(True, kind, decorate)
    np.testing.assert_allclose(_run(step, data, steps=12), _run(whole, data, steps=12), rtol=1e-5)
    got, want = (t.dynamic_tables["items"].table.export() for t in (tables, whole_tables))
    order_got, order_want = np.argsort(got[0].numpy()), np.argsort(want[0].numpy())
    np.testing.assert_array_equal(got[0].numpy()[order_got], want[0].numpy()[order_want])
    np.testing.assert_allclose(got[1].numpy()[order_got], want[1].numpy()[order_want], rtol=1e-5, atol=1e-7)
    assert tables.dynamic_tables["items"].stats()["step"] == 12


@pytest.mark.parametrize("kind, decorate", [("adagrad", htf.function), ("adam", tf.function)])
def test_a_table_looked_up_twice_in_a_step_equals_one_lookup(kind, decorate):
    """The second lookup appends its distinct rows to the table's buffer; the update sums them per id."""
    data = _data(steps=12)
    _, step = _loop(True, kind, decorate, split=True)
    _, plain = _loop(False, kind, decorate)
    np.testing.assert_allclose(_run(step, data, steps=12), _run(plain, data, steps=12), rtol=1e-5)


def test_checkpoint_round_trip_and_resumed_training_are_bit_identical(tmp_path):
    data = _data()
    tables, step = _loop(True, "adam", htf.function)
    _run(step, data, steps=12)
    path = step.checkpoint.write(str(tmp_path / "t"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert any(n.startswith("tables/items/") for n in names) and not any("distinct_rows" in n for n in names)
    restored, resumed = _loop(True, "adam", htf.function)
    resumed.checkpoint.read(path).assert_existing_objects_matched()
    for a, b in zip(tables.dynamic_tables["items"].table.export(), restored.dynamic_tables["items"].table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # training on from the checkpoint == training without a stop (Adam: slots and bias correction restored)
    np.testing.assert_array_equal(_run(resumed, data, first=12, steps=10), _run(step, data, first=12, steps=10))


def test_inference_lookups_do_not_insert():
    tables = Tables([DynamicTableConfig("items", D, **DYN)])
    first = tables.lookup("items", tf.constant([[5, 2**62]]), training=False)
    assert tables.dynamic_tables["items"].stats()["size"] == 0
    again = tables.lookup("items", tf.constant([[5, 2**62]]), "sum")  # training defaults to True: inserted
    assert tables.dynamic_tables["items"].stats()["size"] == 2
    np.testing.assert_allclose(again.numpy(), first.numpy().sum(axis=1), rtol=1e-6)


def test_bad_inputs_name_the_table_and_the_fix(tmp_path):
    tables = Tables([DynamicTableConfig("items", D, **DYN), TableConfig("ctx", 10, D)])
    with pytest.raises(TypeError, match=r"'items'.*int64.*Fix"):
        tables.lookup("items", tf.constant([1.5]))
    with pytest.raises(TypeError, match=r"'items'.*int64"):
        tables.lookup("items", tf.constant(["a"]))
    for kwargs, what in (
        ({"hot_rows": 0}, "hot_rows"),
        ({"capacity": -1}, "capacity"),
        ({"dim": 0}, "dim"),
        ({"warmup_steps": 2**32}, r"warmup_steps in \[0, 4294967295\]"),  # the store counts steps in 32 bits
        ({"flush_every": 2**33}, r"flush_every in \[1, 4294967295\]"),
    ):
        with pytest.raises(ValueError, match=rf"'bad'.*{what}"):
            DynamicTableConfig("bad", **{"dim": D, **kwargs})
    with pytest.raises(ValueError, match=r"'items'.*dynamic.*dynamic_tables\['items'\]"):
        tables.table("items")
    with pytest.raises(ValueError, match="used twice"):
        Tables([DynamicTableConfig("x", D), TableConfig("x", 3, D)])

    tables.lookup("items", tf.constant([1, 2], tf.int64))
    path = tf.train.Checkpoint(tables=tables).write(str(tmp_path / "t"))
    wide = Tables([DynamicTableConfig("items", D + 1, **DYN), TableConfig("ctx", 10, D)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'items' has dim"):
        tf.train.Checkpoint(tables=wide).read(path)
    other = Tables([DynamicTableConfig("users", D, **DYN)])
    with pytest.raises(ValueError, match=r"'users'.*holds table 'items'.*rename"):
        tf.train.Checkpoint(t=other.dynamic_tables["users"].table).read(
            tf.train.Checkpoint(t=tables.dynamic_tables["items"].table).write(str(tmp_path / "one"))
        )


def test_an_unhooked_optimizer_is_a_clear_error_not_a_silent_buffer_update():
    tables = Tables([DynamicTableConfig("items", D, **DYN)])
    optimizer = tf.keras.optimizers.SGD(0.1)  # no slots: unguarded, it would update only the step's buffer

    @htf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tables.lookup("items", ids, training=True))
        grads = tape.gradient(loss, tables.trainable_variables)
        optimizer.apply_gradients(zip(grads, tables.trainable_variables))
        return loss

    with pytest.raises(ValueError, match=r"dynamic table 'items' is trained by optimizer SGD, which is not hooked"):
        step(tf.constant([1, 2, 3], tf.int64))


def test_a_saved_model_of_a_module_with_dynamic_tables_loads_after_import_hybridtf(tmp_path):
    """Its functions hold the HybridHash store's ops: ``import hybridtf`` (before or after TensorFlow) registers
    them, with no hybridtf lookup run in the loading process."""
    import subprocess
    import sys

    class Scorer(tf.Module):
        def __init__(self):
            self.tables = Tables([DynamicTableConfig("items", D, **DYN)])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, ids):
            return self.tables.lookup("items", ids, training=False)

    module = Scorer()
    module.tables.lookup("items", tf.constant([3, 2**40], tf.int64), training=True)  # two stored rows
    ids = np.array([3, 2**40, 11], np.int64)
    want = module.serve(tf.constant(ids)).numpy()
    tf.saved_model.save(module, str(tmp_path / "scorer"))
    np.save(tmp_path / "want.npy", want)
    for first in ("import hybridtf, tensorflow as tf", "import tensorflow as tf, hybridtf"):
        code = (
            f"{first}; import numpy as np; loaded = tf.saved_model.load({str(tmp_path / 'scorer')!r}); "
            f"got = loaded.serve(tf.constant({ids.tolist()}, tf.int64)).numpy(); "
            f"np.testing.assert_array_equal(got, np.load({str(tmp_path / 'want.npy')!r}))"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]

"""A packed layer's ``embeddings`` answers a variable's calls as the plain layer's variable does.

Users pull rows out of a trained table (a retrieval index: ``layer.embeddings[user_id]``), reset or edit rows
(``table[0].assign(...)``, ``scatter_update``) and compute with the table (``table * 2``, a norm). After
``optimize`` the table is a view of rows inside a packed variable: the same calls give the same rows, writes
reach only the table's own rows and the training that follows, and indices out of the table are refused
naming it. (Found by a probe: indexing, operators, ``value()``, ``assign_add`` and ``scatter_update`` raised
TypeError or AttributeError.) An export of the optimized model names the table and the ids when an id is
out of range (the probe saw ``assertion failed: [...]``), and its config and JSON are the plain model's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

L = tf.keras.layers


def build():
    tf.keras.utils.set_random_seed(0)
    user = L.Input((1,), dtype="int32", name="user")
    item = L.Input((1,), dtype="int32", name="item")
    u = L.Flatten(name="u_flat")(L.Embedding(50, 8, name="u_emb")(user))
    i = L.Flatten(name="i_flat")(L.Embedding(40, 8, name="i_emb")(item))
    model = tf.keras.Model([user, item], L.Dense(1, name="out")(L.Multiply(name="mf")([u, i])), name="mf_model")
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
    return model


def batch():
    rng = np.random.default_rng(1)
    x = {"user": rng.integers(0, 50, (64, 1)).astype(np.int32), "item": rng.integers(0, 40, (64, 1)).astype(np.int32)}
    return x, rng.normal(size=(64, 1)).astype(np.float32)


@pytest.fixture(scope="module")
def models():
    plain, packed = build(), htf.keras.optimize(build())
    assert len(packed.hybridtf_plan.packed_tables) == 1 and not packed.hybridtf_skipped
    return plain, packed


def edit(table):
    """Reads and writes of ``table`` as a user makes them; returns what the reads gave."""
    reads = [
        table[5],
        table[-1],
        table[2:9:3],
        table[9:1:-2],
        table[::-1],
        table[..., 0],
        table[:, None],
        table[tf.constant(-3)],
        table * 2,
        1.0 - table,
        -table,
        np.ones((40, 8), np.float32) * table,
        tf.norm(table, axis=1),
        table.value(),
        tf.stack(list(table)),
    ]
    table[0].assign(tf.ones(8))
    table[2:4, :2].assign(tf.fill((2, 2), 3.0))
    table[-1].assign(tf.fill([8], 4.0))
    tf.function(lambda: table[1].assign(tf.fill([8], 2.0)))()
    table.assign_add(tf.fill((40, 8), 0.25))
    table.assign_sub(tf.fill((40, 8), 0.125))
    table.scatter_update(tf.IndexedSlices(tf.fill((2, 8), -1.0), tf.constant([6, 39])))
    table.scatter_add(tf.IndexedSlices(tf.fill((2, 8), 5.0), tf.constant([6, 7])))
    table.scatter_sub(tf.IndexedSlices(tf.ones((1, 8)), tf.constant([10])))
    return [np.asarray(r) for r in reads]


def test_reads_and_writes_equal_the_plain_variables_and_reach_training(models):
    plain, packed = models
    neighbour = packed.get_layer("u_emb").embeddings.numpy()
    for got, want in zip(edit(packed.get_layer("i_emb").embeddings), edit(plain.get_layer("i_emb").embeddings)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(packed.get_layer("i_emb").embeddings.numpy(), plain.get_layer("i_emb").embeddings)
    np.testing.assert_array_equal(packed.get_layer("u_emb").embeddings.numpy(), neighbour)  # packed next to it
    x, y = batch()
    np.testing.assert_allclose(packed.train_on_batch(x, y), plain.train_on_batch(x, y), rtol=1e-6)


@pytest.mark.parametrize("index", [40, -41])
def test_an_index_outside_the_table_is_refused_naming_it(models, index):
    table = models[1].get_layer("i_emb").embeddings
    with pytest.raises(tf.errors.InvalidArgumentError, match="embedding table 'i_emb', which has 40 rows"):
        table[index]
    with pytest.raises(tf.errors.InvalidArgumentError, match="'i_emb', which has 40 rows"):
        table[tf.constant(index)]


def test_a_sparse_write_outside_the_table_is_refused_and_writes_nothing(models):
    packed = models[1]
    before = {name: packed.get_layer(name).embeddings.numpy() for name in ("u_emb", "i_emb")}
    refused = r"scatter_update of embedding table 'i_emb': row ids must be in \[0, 40\), got ids from 1 to 40"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        packed.get_layer("i_emb").embeddings.scatter_update(tf.IndexedSlices(tf.ones((2, 8)), tf.constant([1, 40])))
    with pytest.raises(TypeError, match=r"tf\.IndexedSlices"):
        packed.get_layer("i_emb").embeddings.scatter_add(tf.ones((2, 8)))
    for name, rows in before.items():
        np.testing.assert_array_equal(packed.get_layer(name).embeddings.numpy(), rows)


def test_an_export_names_the_table_and_the_ids_out_of_its_range(models, tmp_path):
    plain, packed = models
    tf.saved_model.save(packed, str(tmp_path / "export"))
    serve = tf.saved_model.load(str(tmp_path / "export"))
    x = [tf.constant([[3]]), tf.constant([[2]])]  # the model's inputs are a list: its signature takes one
    np.testing.assert_allclose(serve(x), plain(x), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"i_emb\\?' got an id outside its vocabulary \[0, 40\)"):
        serve([tf.constant([[3], [4]]), tf.constant([[2], [45]])])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids span\] \[2\] \[to\] \[45\]"):
        serve([tf.constant([[3], [4]]), tf.constant([[2], [45]])])


def test_an_optimized_models_config_and_json_are_the_plain_models():
    """Keras serializes its own classes by their public path (``keras.layers``); a packed layer's class is a
    subclass made at optimize time, which the probe saw serialized under its module with a registered name."""
    plain, packed = build(), htf.keras.optimize(build())
    assert packed.to_json() == plain.to_json()
    assert packed.get_config() == plain.get_config()
    config = next(c for c in packed.get_config()["layers"] if c["name"] == "i_emb")
    assert (config["module"], config["registered_name"]) == ("keras.layers", None)


def test_an_assign_of_the_wrong_shape_names_the_table_and_writes_nothing(models):
    table = models[1].get_layer("i_emb").embeddings
    before = table.numpy()
    with pytest.raises(ValueError, match=r"'i_emb' has shape \[40, 8\]; the value assigned has shape \[41, 8\]"):
        table.assign(tf.zeros((41, 8)))
    np.testing.assert_array_equal(table.numpy(), before)

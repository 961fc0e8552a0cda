"""The steps of ``hybridtf.keras.optimize`` (capture, plan, storage, rewrite, hooks), each on its own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.integrations import keras_model
from hybridtf._src.integrations import keras_optimize_steps as steps
from hybridtf._src.plan.packing import PackingPlan
from hybridtf._src.rewrite.packed_storage import TableView

BATCH = 16


def _model(seed=3):
    tf.keras.utils.set_random_seed(seed)
    user = tf.keras.Input(shape=(), dtype=tf.int64, name="user")
    item = tf.keras.Input(shape=(), dtype=tf.int64, name="item")
    cate = tf.keras.Input(shape=(), dtype=tf.int64, name="cate")
    vectors = [
        tf.keras.layers.Embedding(40, 4, name="emb_user")(user),
        tf.keras.layers.Embedding(30, 4, name="emb_item")(item),
        tf.keras.layers.Embedding(20, 8, name="emb_cate")(cate),
        tf.keras.layers.Embedding(10, 4, embeddings_constraint=tf.keras.constraints.NonNeg(), name="emb_fixed")(
            item % 10
        ),
    ]
    hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(tf.keras.layers.Concatenate()(vectors))
    out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden)
    return tf.keras.Model({"user": user, "item": item, "cate": cate}, out)


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    x = {"user": rng.integers(0, 40, BATCH), "item": rng.integers(0, 30, BATCH), "cate": rng.integers(0, 20, BATCH)}
    return x, rng.integers(0, 2, (BATCH, 1)).astype(np.float32)


def test_capture_lists_packable_tables_and_skipped_layers_with_the_reason():
    captured, skipped, specs = steps.capture(_model())
    assert [t.name for t in captured] == ["emb_user", "emb_item", "emb_cate"]
    assert [(s.name, s.num_rows, s.dim) for s in specs] == [
        ("emb_user", 40, 4),
        ("emb_item", 30, 4),
        ("emb_cate", 20, 8),
    ]
    assert [s.name for s in skipped] == ["emb_fixed"] and "constraint" in skipped[0].reason


def test_make_plan_groups_by_dim_checks_a_given_plan_and_handles_no_tables():
    _, skipped, specs = steps.capture(_model())
    plan = steps.make_plan(specs, exclude=["emb_item"], max_shards=1)
    assert sorted(m.name for pt in plan.packed_tables for m in pt.members) == ["emb_cate", "emb_user"]
    assert [s.name for s in steps.skipped_layers(skipped, plan)] == ["emb_fixed", "emb_item"]
    assert "remove it from exclude" in steps.skipped_layers(skipped, plan)[1].reason
    assert steps.make_plan(specs, plan) is plan  # a given plan is used as it is
    smaller = [s if s.name != "emb_user" else dataclasses.replace(s, num_rows=41) for s in specs]
    with pytest.raises(ValueError, match="'emb_user' as 40 x 4, the model's layer is 41 x 4"):
        steps.make_plan(smaller, plan)
    empty = steps.make_plan([])
    assert isinstance(empty, PackingPlan) and not empty.packed_tables


def test_pack_storage_moves_the_weights_into_packed_tables_without_changing_them():
    model = _model()
    before = {w.name: w.numpy() for w in model.weights}
    embeddings = {layer.name: layer.embeddings.numpy() for layer in model.layers if layer.name.startswith("emb_")}
    captured, _, specs = steps.capture(model)
    plan = steps.make_plan(specs, max_shards=1)
    state = steps.pack_storage(model, plan, captured)
    assert not keras_model.is_optimized(model)  # the model's own class is the rewrite step's business
    for pt in plan.packed_tables:
        packed = state.runtime.storage.packed[pt.name].numpy()
        for m in pt.members:
            np.testing.assert_array_equal(packed[m.row_offset : m.row_offset + m.num_rows], embeddings[m.name])
            layer = model.get_layer(m.name)
            assert isinstance(layer.embeddings, TableView)
            np.testing.assert_array_equal(layer.embeddings.numpy(), embeddings[m.name])
    assert len(state.plain_weights) == len(before)
    for w, (name, value) in zip(state.plain_weights, before.items()):
        np.testing.assert_array_equal(w.numpy(), value, err_msg=name)
    with pytest.raises(ValueError, match="needs a plan with packed tables"):
        steps.pack_storage(_model(), steps.make_plan([]), [])


def test_pack_storage_frees_each_table_once_its_rows_are_in(monkeypatch):
    """Each original is dropped right after its own copy (not after its whole packed table), so it is gone
    before the next member is copied."""
    import weakref

    from hybridtf._src.rewrite import packed_storage

    model = _model()
    embeddings = {layer.name: layer.embeddings.numpy() for layer in model.layers if layer.name.startswith("emb_")}
    originals = {
        layer.name: weakref.ref(layer.embeddings) for layer in model.layers if layer.name in ("emb_user", "emb_item")
    }
    captured, _, specs = steps.capture(model)
    plan = steps.make_plan(specs, max_shards=1)
    (four,) = [pt for pt in plan.packed_tables if pt.dim == 4]
    assert [m.name for m in four.members] == ["emb_user", "emb_item"]
    alive_at_second_copy = []
    real_write = packed_storage._write_member

    def spy(var, layout, rank, offset, num_rows, value):
        if offset > 0:
            alive_at_second_copy.append(originals["emb_user"]() is not None)
        return real_write(var, layout, rank, offset, num_rows, value)

    monkeypatch.setattr(packed_storage, "_write_member", spy)
    state = steps.pack_storage(model, plan, captured)
    assert alive_at_second_copy == [False]
    assert all(ref() is None for ref in originals.values())
    for pt in plan.packed_tables:
        packed = state.runtime.storage.packed[pt.name].numpy()
        for m in pt.members:
            np.testing.assert_array_equal(packed[m.row_offset : m.row_offset + m.num_rows], embeddings[m.name])


def test_the_steps_run_by_hand_give_optimize_and_the_plain_model():
    x, y = _batch()
    plain = _model()
    by_optimize = htf.keras.optimize(_model())
    by_hand = _model()
    captured, skipped, specs = steps.capture(by_hand)
    plan = steps.make_plan(specs)
    state = steps.pack_storage(by_hand, plan, captured)
    keras_model._rewrite_model(
        by_hand, state, steps.skipped_layers(skipped, plan), fused_updates=True, fuse_concat=True, fuse_dense=True
    )
    steps.install_hooks(by_hand, state)
    assert keras_model.is_optimized(by_hand)
    assert by_hand.hybridtf_plan.to_dict() == by_optimize.hybridtf_plan.to_dict()
    assert [s.name for s in by_hand.hybridtf_skipped] == ["emb_fixed"]
    losses = {}
    for name, model in (("plain", plain), ("optimize", by_optimize), ("by_hand", by_hand)):
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
        losses[name] = [model.train_on_batch(x, y) for _ in range(3)]
    np.testing.assert_allclose(losses["by_hand"], losses["plain"], rtol=1e-5)
    assert losses["by_hand"] == losses["optimize"]


def test_install_hooks_gives_a_compiled_optimizer_the_fused_updates():
    model = _model()
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    captured, skipped, specs = steps.capture(model)
    plan = steps.make_plan(specs)
    state = steps.pack_storage(model, plan, captured)
    keras_model._rewrite_model(model, state, skipped, fused_updates=True, fuse_concat=True, fuse_dense=True)
    model.train_function = "stale"
    steps.install_hooks(model, state)
    assert model.train_function is None  # the next fit traces the rewritten step
    assert model._htf_plain_trainable == state.plain_trainable
    packed = {id(v) for v in state.runtime.storage.packed.values()}
    assert model.optimizer._htf_packed == packed  # every packed table gets the fused update

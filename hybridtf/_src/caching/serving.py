"""SavedModel exports of ``DynamicEmbedding`` layers: the learned rows as plain TensorFlow.

A SavedModel never holds the HybridHash store. Each export of a layer gets a
snapshot of its table: a ``tf.lookup.StaticHashTable`` id -> row index and a
``[n + 1, dim]`` row variable whose last row, the row of ids unseen in
training, is zeros (their initial rows would need hybridtf's hash). The
layer's call, traced in the save context, serves through the snapshot, so the
export loads and serves without hybridtf.

* ``tf.saved_model.save`` / ``model.save(dir)``: the layer lists the snapshot
  as a child of its SavedModel object graph (``DynamicEmbedding._trackable_children``)
  and its traced functions capture it.
* Keras's ``model.export`` (``ExportArchive``): the archive is the SavedModel's
  root and holds only the resources it collects before the save (variables,
  and lookup layers of its own); its endpoint, already traced outside the save
  context, is traced again in it. ``install_export_archive_hook`` makes the
  archive's resource collection also take a snapshot of every DynamicEmbedding
  under the models it tracks; the save-context trace then finds that snapshot
  (made for "the next save") instead of creating variables inside an already
  traced ``tf.function``, which TensorFlow refuses.

A snapshot is reused while the table is unchanged, within one save.
"""

from __future__ import annotations

import tensorflow as tf
from keras.src.saving.legacy.saved_model import layer_serialization
from tensorflow.python.saved_model import save_context

from hybridtf._src.distribute import dynamic_exchange

# _serving_options of a snapshot taken for the save that follows (ExportArchive): any save adopts it.
_NEXT_SAVE = object()


def serving_snapshot(layer, for_next_save: bool = False) -> tf.Module:
    """The layer's export snapshot for the current save (made if the table changed or another save runs).

    ``for_next_save``: taken before a save starts (``ExportArchive``); the next save context adopts it.
    """
    options = save_context.get_save_options() if save_context.in_save_context() else None
    store = getattr(layer.table, "store", layer.table)  # a packed member's store
    with tf.init_scope():
        s = layer.table.stats()
        # The table's content: a restore resets the statistics, not the store's import count.
        version = (store.imports, s["step"], s["inserts"], s["evictions"], s["lookups"], s["size"])
        current = getattr(layer, "_serving", None)
        taken_for = getattr(layer, "_serving_options", None)
        reusable = current is not None and current.version == version
        if reusable and (taken_for is options or (taken_for is _NEXT_SAVE and options is not None)):
            object.__setattr__(layer, "_serving_options", options)  # held: its id stays this save's
            return current
        if reusable and for_next_save:
            object.__setattr__(layer, "_serving_options", _NEXT_SAVE)
            return current
        world = layer._shard_world
        if world.distributed:  # every rank exports (a collective): the whole table
            ids, rows = dynamic_exchange.full_export(layer.table, world)[:2]
        else:
            ids, rows = layer.table.export()[:2]
        n = tf.shape(ids, out_type=tf.int64)[0]
        init = tf.lookup.KeyValueTensorInitializer(ids, tf.range(n), tf.int64, tf.int64)
        serving = tf.Module(name=f"{layer.name}_serving")
        serving.version = version
        serving.index = tf.lookup.StaticHashTable(init, default_value=n)
        serving.rows = tf.Variable(tf.concat([rows, tf.zeros([1, layer.output_dim])], 0), trainable=False)
    object.__setattr__(layer, "_serving", serving)
    object.__setattr__(layer, "_serving_options", _NEXT_SAVE if for_next_save else options)
    return serving


def serve(layer, unique):
    """The rows of distinct ids ``unique`` from the layer's export snapshot (zeros for unseen ids)."""
    snapshot = serving_snapshot(layer)
    return tf.gather(snapshot.rows, snapshot.index.lookup(unique))


class ServedFromFunctions(layer_serialization.LayerSavedModelSaver):
    """A SavedModel of the layer without its config: ``load_model`` revives it from its saved functions.

    The SavedModel holds the learned rows as a static lookup plus a gather (``serving_snapshot``), not the
    HybridHash store; rebuilt from its config the layer would make a store the SavedModel has no value for,
    which fails the load. Revived from the functions, it serves the saved rows with or without hybridtf.
    """

    def _python_properties_internal(self):
        metadata = super()._python_properties_internal()
        metadata.pop("config", None)
        return metadata


def _dynamic_layers(root):
    from hybridtf._src.caching.layer import DynamicEmbedding

    for trackable in tf.train.TrackableView(root).descendants():
        if isinstance(trackable, DynamicEmbedding) and trackable.built and trackable.table is not None:
            yield trackable


def install_export_archive_hook() -> None:
    """Lets Keras's ``ExportArchive`` (``model.export``) save DynamicEmbedding layers (see the module doc)."""
    try:
        from keras.src.export import export_lib
    except ImportError:  # another Keras layout: model.export then fails as without the hook
        return
    archive = getattr(export_lib, "ExportArchive", None)
    collect = getattr(archive, "_filter_and_track_resources", None)
    if collect is None or getattr(collect, "_hybridtf_hooked", False):
        return

    def filter_and_track_resources(self):
        collect(self)
        snapshots = []
        for root in getattr(self, "_tracked", ()):
            for layer in _dynamic_layers(root):
                snapshot = serving_snapshot(layer, for_next_save=True)
                if all(snapshot is not s for s in snapshots):
                    snapshots.append(snapshot)
        if snapshots:
            self._misc_assets.extend(snapshots)  # tracked by the archive: the SavedModel holds them

    filter_and_track_resources._hybridtf_hooked = True
    archive._filter_and_track_resources = filter_and_track_resources

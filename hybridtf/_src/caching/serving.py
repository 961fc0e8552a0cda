"""SavedModel exports of ``DynamicEmbedding`` layers: the learned rows as plain TensorFlow.

A SavedModel never holds the HybridHash store. Each export of a layer gets a
snapshot of its table: a ``tf.lookup.StaticHashTable`` id -> row index and a
``[n, dim]`` row variable; ids unseen in training get the zero row (their
initial rows would need hybridtf's hash), also every id of a table that has no
rows yet. The layer's call, traced in the save context, serves through the
snapshot, so the export loads and serves without hybridtf.

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

A wrapped Estimator's PREDICT graph (``predict``, ``export_saved_model``) is
built inside ``context.plain_ops()``; a TF1 graph has no save context and no
table content at build time, so there a dynamic table is a ``GraphServingRows``:
two variables named as the table's checkpoint entries
(``hybridtf_dynamic/<table>/ids`` and ``.../rows``), which the Estimator's
Saver restores from the training checkpoint and an export writes back under
the same keys, and a ``StaticHashTable`` initialized from them with the other
lookup tables (after the restore). Its graph holds no hybridtf op either.
"""

from __future__ import annotations

import tensorflow as tf
from keras.src.saving.legacy.saved_model import layer_serialization
from tensorflow.python.saved_model import save_context

from hybridtf._src.caching.table import HybridHashTable
from hybridtf._src.capture import context
from hybridtf._src.distribute import dynamic_exchange, watchdog
from hybridtf._src.distribute.world import World

# Name-based (TF1 Saver) checkpoint keys of a dynamic table: <CHECKPOINT_PREFIX>/<table>/<field>.
CHECKPOINT_PREFIX = "hybridtf_dynamic"

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
        if world.distributed:  # every rank exports (a collective): the whole table; a rank alone ends with the error
            with watchdog.collective_phase(world, watchdog.CHECKPOINT_GATHER, f"export of table {layer.name!r}"):
                ids, rows = dynamic_exchange.full_export(layer.table, world)[:2]
        else:
            ids, rows = layer.table.export()[:2]
        serving = tf.Module(name=f"{layer.name}_serving")
        serving.version = version
        serving.index = _index_of_rows(ids)
        serving.rows = tf.Variable(rows, trainable=False)
    object.__setattr__(layer, "_serving", serving)
    object.__setattr__(layer, "_serving_options", _NEXT_SAVE if for_next_save else options)
    return serving


def _index_of_rows(ids) -> tf.lookup.StaticHashTable:
    """id -> its row index in ``ids``; any other id -> -1 (``_gather_or_zeros`` serves it the zero row).

    TensorFlow refuses a static table initialized with no keys: a table without rows (never trained,
    no checkpoint) maps the key 0 to ``n`` = 0, the zero row every other id gets too.
    """
    n = tf.shape(ids, out_type=tf.int64)[0]
    pad = tf.maximum(1 - n, 0)  # 1 when there are no rows
    keys = tf.concat([ids, tf.zeros([pad], tf.int64)], 0)
    init = tf.lookup.KeyValueTensorInitializer(keys, tf.concat([tf.range(n), tf.fill([pad], n)], 0))
    return tf.lookup.StaticHashTable(init, default_value=-1)


def _gather_or_zeros(rows, index):
    """Rows ``index`` of ``rows`` [n, dim], zeros where index is -1 or n."""
    n = tf.shape(rows, out_type=tf.int64)[0]
    padded = tf.concat([rows, tf.zeros([1, rows.shape[-1]], rows.dtype)], 0)
    return tf.gather(padded, tf.where(index < 0, n, index))


def serve(layer, unique):
    """The rows of distinct ids ``unique`` from the layer's export snapshot (zeros for unseen ids)."""
    snapshot = serving_snapshot(layer)
    return _gather_or_zeros(snapshot.rows, snapshot.index.lookup(unique))


class GraphServingRows:
    """A dynamic table in a TF1 PREDICT graph: its checkpointed ids and rows, looked up with plain TF ops.

    Unseen ids get the zero row, as in a Keras export. It cannot train: a training lookup reads too.

    Args:
        config: the table's ``TableConfig`` (its name and dim are used).
    """

    serving_only = True
    world = World()  # the checkpoint holds the whole table, also under Horovod

    def __init__(self, config):
        self.config = config
        self.name = config.name
        scope = f"{CHECKPOINT_PREFIX}/{config.name}/"
        with tf.init_scope(), tf.name_scope(scope):
            self.ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False, name="ids")
            self.rows = tf.Variable(
                tf.zeros([0, config.dim]), shape=tf.TensorShape([None, config.dim]), trainable=False, name="rows"
            )
            for var, field in ((self.ids, "ids"), (self.rows, "rows")):
                if var.op.name != scope + field:  # restored by name: another op took it
                    raise ValueError(
                        f"dynamic table {self.name!r}: its serving variable is named {var.op.name!r}, not "
                        f"{scope + field!r} (the checkpoint key it is restored from), because the graph already has "
                        f"an op of that name. Give each dynamic table its own name."
                    )
            self.index = _index_of_rows(self.ids.read_value())

    check_ids = HybridHashTable.check_ids  # the same dtype check and message (it reads self.name only)

    def lookup(self, ids, counts=None, insert: bool = False, members=None):
        """Rows ``[n, dim]`` of the 1-D ids: the checkpoint's row, or zeros for an id it does not hold."""
        del counts, insert, members
        return _gather_or_zeros(self.rows, self.index.lookup(self.check_ids(tf.convert_to_tensor(ids))))


def serves_graph_rows() -> bool:
    """Whether a dynamic table built now is a ``GraphServingRows`` (a TF1 graph inside ``context.plain_ops()``)."""
    return not tf.executing_eagerly() and not save_context.in_save_context() and context.in_plain_ops()


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


def _dynamic_layers(root, layer_class):
    for trackable in tf.train.TrackableView(root).descendants():
        if isinstance(trackable, layer_class) and trackable.built and trackable.table is not None:
            yield trackable


def install_export_archive_hook(layer_class) -> None:
    """Lets Keras's ``ExportArchive`` (``model.export``) save ``layer_class`` (DynamicEmbedding) layers.

    See the module doc. ``layer_class`` is passed in by ``layer.py``, which imports this module.
    """
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
            for layer in _dynamic_layers(root, layer_class):
                snapshot = serving_snapshot(layer, for_next_save=True)
                if all(snapshot is not s for s in snapshots):
                    snapshots.append(snapshot)
        if snapshots:
            self._misc_assets.extend(snapshots)  # tracked by the archive: the SavedModel holds them

    filter_and_track_resources._hybridtf_hooked = True
    archive._filter_and_track_resources = filter_and_track_resources

"""A packed layer trained from outside the model that packed it.

After ``optimize(A)`` a packed layer's table is a row range of A's packed
variable, which the layer does not list among its own weights (A does). A
model built afterwards from the same layer objects (a new head on A's
embeddings: transfer learning, a second task) calls the layer outside A's
call: the lookup still reads A's packed variable, but that model's
``trainable_variables`` do not hold it, so its ``fit`` would train the head
and leave the tables as they are, silently (found by a probe). The plain
model would have trained them.

``check_training_call`` runs on such a call. Under a gradient tape, inside a
Keras ``train_step`` of a model whose trainable variables miss the packed
variable, it raises with the fix (``SHARED_LAYERS_FIX``: one joint model, or
the layers rebuilt plain); under a tape elsewhere (a custom loop, which may
take the gradient for A's variables) it warns once per packed variable.
``optimize`` of such a model is refused as well
(``keras_notices.refuse_layers_of_another_model``).
"""

from __future__ import annotations

import logging
import sys

import tensorflow as tf
from tensorflow.python.eager import record

from hybridtf._src.errors import HybridTFError
from hybridtf._src.once import first_time

_log = logging.getLogger("hybridtf")


SHARED_LAYERS_FIX = (
    "Models that share embedding layers train exactly as one model: build tf.keras.Model(inputs, [out_a, out_b]) "
    "from the plain layers and optimize that one (each head, called on its own, then reads the packed tables for "
    "inference). To reuse an optimized model's trained layers in a new model, rebuild them plain first: "
    "copy = tf.keras.models.clone_model(optimized); copy.set_weights(optimized.get_weights()); build the new "
    "model from copy's layers and optimize it."
)


class OutsideTrainingError(HybridTFError, ValueError):
    """A model trains a packed layer that hybridtf packed into another model's variables."""


def _training_model():
    """The Keras model whose ``train_step`` is on the Python stack (the innermost one), or None."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "train_step":
            owner = frame.f_locals.get("self")
            if isinstance(owner, tf.keras.Model):
                return owner
        frame = frame.f_back
    return None


def check_training_call(layer, variable) -> None:
    """Refuses (in a Keras ``train_step``) or warns about (elsewhere) a training call of ``layer`` outside
    the model whose packed ``variable`` holds its table; nothing outside a gradient tape or for a frozen layer.

    Raises:
        OutsideTrainingError: the model being trained does not train ``variable``.
    """
    if not layer.trainable or not record.could_possibly_record():
        return
    trainer = _training_model()
    fix = SHARED_LAYERS_FIX + " To train the new model's head alone, freeze the layers (layer.trainable = False)."
    if trainer is not None:
        if any(v is variable for v in trainer.trainable_variables):
            return
        raise OutsideTrainingError(
            f"embedding layer {layer.name!r} is packed into another model's variable {variable.name!r} by "
            f"hybridtf.keras.optimize, and model {trainer.name!r} (built from the same layer) "
            f"calls it while it trains: that model's trainable_variables do not hold the table, so its fit would "
            f"train everything but the table, silently. {fix}"
        )
    if first_time(variable, "_htf_outside_tape_noted"):
        _log.warning(
            "hybridtf: embedding layer %r is called under a gradient tape outside the model that packed its table "
            "into variable %r (a model built from the same layer objects, or the layer on its own). Its table "
            "trains only where the step takes the gradient for that variable (the optimized model's "
            "trainable_variables, hybridtf.keras.layer_variables); a model built afterwards from the layer does "
            "not list it. %s",
            layer.name,
            variable.name,
            fix,
        )

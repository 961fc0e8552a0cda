"""Exception classes of hybridtf.

Every error hybridtf raises on its own says what was wrong and what to do about
it. Errors raised inside TensorFlow kernels surface as
``tf.errors.InvalidArgumentError`` with the same wording as the Python checks.
"""

from __future__ import annotations


class HybridTFError(Exception):
    """Base class of hybridtf's own exceptions.

    Raised while AutoGraph converts a step (Keras ``fit``'s ``train_function``, a user's ``tf.function``),
    they keep their class: ``ag_pass_through`` tells AutoGraph not to rebuild them (it turns an exception whose
    constructor it does not know into a ``StagingError``, which ``except ValueError`` would not catch).
    """

    ag_pass_through = True


class OpLibraryError(HybridTFError, ImportError):
    """The compiled op library is missing, or was built for another TensorFlow."""


class NativeModuleError(HybridTFError, ImportError):
    """The pybind11 module ``hybridtf._native`` is missing or broken."""


class CollectiveTimeoutError(HybridTFError, RuntimeError):
    """A rank waited too long in a Horovod collective that the other ranks did not join.

    The message says which collective, where every rank was, and what to do;
    it was printed to stderr before Horovod was shut down on this rank.
    """


class CollectiveAbortedError(HybridTFError, RuntimeError):
    """Another rank ended the Horovod job while this rank was waiting in a collective."""


class PlanKeyError(HybridTFError, KeyError):
    """A table is unknown to the packing plan, or is not in any packed table."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class InterleavingError(HybridTFError, ValueError):
    """A model or setting that micro-batches or interleaving groups cannot run with the same math."""

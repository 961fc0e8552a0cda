"""Record / replay context through which captured lookups reach the rewrite.

A wrapped model (or ``hybridtf.function``) runs the user's forward code twice
while tracing: first *recording* (every captured lookup stores its request and
returns a placeholder), then, after the rewrite has computed all lookups with a
few packed chains, *replaying* (every captured lookup returns its precomputed
output, in the same order). Outside both, a captured lookup runs on its own:
the un-rewritten path, exact by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

from hybridtf._src import thread_state
from hybridtf._src.errors import HybridTFError

_state = threading.local()


class CaptureError(HybridTFError):
    """The replay pass did not see the lookups the record pass saw."""


@dataclasses.dataclass
class LookupRequest:
    """One captured lookup: which table, which ids, how to combine them.

    Attributes:
        table: name of the embedding table (unique in the model).
        ids: int tensor of any shape (one-hot: output ``ids.shape + [dim]``),
            or a ``tf.RaggedTensor`` / ``tf.SparseTensor`` of rank 2 (multi-hot
            bags: output ``[batch, dim]``).
        combiner: ``"none"`` for one-hot ids, ``"sum" | "mean" | "sqrtn"`` for bags.
        owner: the object that issued it (used to check replay order).
    """

    table: str
    ids: Any
    combiner: str = "none"
    owner: Any = None


class _Recording:
    def __init__(self):
        self.requests: list[LookupRequest] = []


class _Replaying:
    def __init__(self, requests, outputs):
        self.requests = requests
        self.outputs = outputs
        self.position = 0


def _stack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def active():
    """The innermost active recording/replaying context, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def is_recording() -> bool:
    """Whether the innermost active context records (its lookups' outputs are discarded)."""
    return isinstance(active(), _Recording)


# Set on the recorder by hybridtf.function's and Estimator's record passes (see record_pass_runs_lookups).
RUNS_LOOKUPS_ATTR = "lookups_in_record_pass"


def record_pass_runs_lookups() -> bool:
    """Whether the active recording wants real lookups instead of zero stand-ins.

    ``hybridtf.function`` records in a scratch graph that never runs; there a
    recorded lookup returns its direct lookup, so that gradients reach the
    tables (optimizers reject a step in which no variable has a gradient)
    and code that inspects the values still traces. Model-level recording
    (``optimize``) runs in the real graph and keeps zero stand-ins.

    Example:
        >>> with recording() as rec:
        ...     setattr(rec, RUNS_LOOKUPS_ATTR, True)
        ...     record_pass_runs_lookups()
        True
    """
    return bool(getattr(active(), RUNS_LOOKUPS_ATTR, False))


@contextlib.contextmanager
def plain_ops():
    """Inside: hybridtf's layers look up with plain TensorFlow ops, as in a SavedModel export.

    A wrapped Estimator's PREDICT graph is built inside, so that ``export_saved_model`` writes a graph
    without hybridtf's ops (TF1 exports have no save context for the layers to see).
    """
    with thread_state.setting(_state, "plain_ops", True, default=False):
        yield


def in_plain_ops() -> bool:
    """Whether lookups should use plain TensorFlow ops: a SavedModel export, or inside ``plain_ops()``."""
    from tensorflow.python.saved_model import save_context

    return save_context.in_save_context() or bool(getattr(_state, "plain_ops", False))


@contextlib.contextmanager
def wrapped_model_fn():
    """Inside: a model_fn wrapped by ``hybridtf.estimator.model_fn`` is building its graph (see
    ``caching/layer.check_graph_mode``)."""
    with thread_state.setting(_state, "wrapped_model_fn", True, default=False):
        yield


def in_wrapped_model_fn() -> bool:
    """Whether ``hybridtf.estimator.model_fn``'s wrapper is building the current graph."""
    return bool(getattr(_state, "wrapped_model_fn", False))


@contextlib.contextmanager
def recording():
    """Collects the LookupRequests issued inside; yields the recorder."""
    rec = _Recording()
    _stack().append(rec)
    try:
        yield rec
    finally:
        _stack().pop()


@contextlib.contextmanager
def replaying(requests, outputs):
    """Serves ``outputs`` to the lookups issued inside, in recorded order."""
    rep = _Replaying(list(requests), list(outputs))
    _stack().append(rep)
    try:
        yield rep
    finally:
        _stack().pop()
    if rep.position != len(rep.requests):
        raise CaptureError(
            f"the forward pass issued {rep.position} embedding lookups while replaying but {len(rep.requests)} "
            "while recording; the model's lookups must not depend on the training flag or on other embeddings."
        )


def dispatch(request: LookupRequest, placeholder_fn, direct_fn):
    """Routes one lookup: record it, replay it, or run it directly.

    Args:
        request: the lookup.
        placeholder_fn: builds a stand-in output while recording (no lookup).
        direct_fn: runs the lookup on its own (outside any context).

    Returns:
        The lookup's output.
    """
    ctx = active()
    if ctx is None:
        return direct_fn()
    if isinstance(ctx, _Recording):
        ctx.requests.append(request)
        return placeholder_fn()
    if ctx.position >= len(ctx.requests):
        raise CaptureError(
            f"embedding table {request.table!r} was looked up while replaying but not while recording; "
            "the model's lookups must not depend on the training flag."
        )
    expected = ctx.requests[ctx.position]
    if expected.owner is not request.owner or expected.table != request.table:
        raise CaptureError(
            f"lookup #{ctx.position} was table {expected.table!r} while recording but {request.table!r} while "
            "replaying; the model's lookups must run in the same order in every pass."
        )
    out = ctx.outputs[ctx.position]
    ctx.position += 1
    return out

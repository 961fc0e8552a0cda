"""Which tables of a packed variable got a gradient in a traced training step.

In the plain model a table whose lookups do not reach the loss (a head compiled
with ``loss=None``, a lookup under ``tf.stop_gradient``, a table the step does
not look up) has no gradient, and Keras leaves it alone. Packed with tables
that do get one, it is part of a variable that has a gradient: an optimizer
that updates every row of a variable it is given (weight decay, Keras's FTRL,
moments that decay everywhere) would change it. ``tables_without_gradient``
names such tables, so that the optimizer keeps their rows and slots as they
were (``keras_optimizers``).

How it is known, while the step is traced (graph mode): each packed chain's
StitchCombine registers which table each of its fields reads, keyed by the
gathered rows tensor it reads (``register_fields``); the gradient functions of
the fused ops that read those rows (StitchCombine, StitchConcat,
StitchConcatMatMul, StitchFM) note the tables of the fields whose output
gradient is real (``note_fields``): an output nothing differentiable reads
arrives as None or as the zeros TensorFlow fills in. A gradient function that
meets rows no chain registered makes the whole step unknown, and nothing is
kept then (as before this module existed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import func_graph

_FIELDS = "_htf_field_tables"  # graph attribute: rows tensor name -> table per field
_ARRIVED = "_htf_tables_with_gradient"  # graph attribute: set of table names, or None (unknown)


def _graph():
    """The outermost graph of the step being traced (its gradient and update may sit in branches or loop bodies).

    Under eager execution a ``tf.function``'s graph has the process's global graph as its ``outer_graph``: the
    walk stops at the function's graph, or every step traced in the process would share one record (a table
    named like one that got a gradient in an earlier model's step was taken to have one).
    """
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    eager_outside = tf.compat.v1.executing_eagerly_outside_functions()
    while getattr(graph, "outer_graph", None) is not None:
        if eager_outside and not isinstance(graph.outer_graph, func_graph.FuncGraph):
            break
        graph = graph.outer_graph
    return graph


def register_fields(rows: tf.Tensor, tables: Sequence[str]) -> None:
    """Fields ``0..n-1`` of the chain reading ``rows`` look up ``tables[f]`` (graph mode; eagerly a no-op)."""
    graph = _graph()
    if graph is None or not isinstance(rows, tf.Tensor):
        return
    registry = getattr(graph, _FIELDS, None)
    if registry is None:
        registry = {}
        setattr(graph, _FIELDS, registry)
    registry[_key(rows)] = list(tables)


def _field_tables(rows: tf.Tensor) -> list[str] | None:
    return getattr(_graph(), _FIELDS, {}).get(_key(rows))


def _key(rows: tf.Tensor) -> str:
    return f"{id(rows.graph)}:{rows.name}"


def is_zero_fill(grad) -> bool:
    """Whether ``grad`` is missing or the zeros TensorFlow fills in for an output without gradient."""
    if grad is None:
        return True
    if not isinstance(grad, tf.Tensor) or tf.executing_eagerly():
        return False
    op = grad.op
    if op.type == "ZerosLike":
        return True
    if op.type == "Fill":
        value = tf.get_static_value(op.inputs[1])
        return value is not None and not np.any(value)
    if op.type == "Const":
        value = tf.get_static_value(grad)
        return value is not None and not np.any(value)
    return False


def note_fields(rows: tf.Tensor, fields: Iterable[int]) -> None:
    """In the gradient function of an op reading ``rows``: its fields ``fields`` got a real gradient."""
    graph = _graph()
    if graph is None or not isinstance(rows, tf.Tensor):
        return
    arrived = getattr(graph, _ARRIVED, set())
    if arrived is None:
        return
    tables = _field_tables(rows)
    if tables is None:
        setattr(graph, _ARRIVED, None)  # rows of no registered chain: this step's arrivals are unknown
        return
    fields = list(fields)
    if any(not 0 <= f < len(tables) for f in fields):
        setattr(graph, _ARRIVED, None)
        return
    arrived.update(tables[f] for f in fields)
    setattr(graph, _ARRIVED, arrived)


def tables_without_gradient(tables: Sequence[str]) -> list[str]:
    """Those of ``tables`` (one packed variable's members) that no gradient reached in the step traced now.

    Empty when unknown: eagerly, when a gradient function met rows of no registered chain, or when no member
    of ``tables`` got a gradient in this graph (the gradient may have been computed in another one).
    """
    graph = _graph()
    arrived = getattr(graph, _ARRIVED, None) if graph is not None else None
    if not arrived or not arrived.intersection(tables):
        return []
    return [t for t in tables if t not in arrived]

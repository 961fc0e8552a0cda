"""Command-line checks the examples share: a bad value is a usage error (exit status 2), not a traceback.

The ``type=`` functions turn a bad value into argparse's usage line plus
``error: argument --batch: must be a positive integer, got 0``; ``check_csv_columns``
does the same for a ``--data`` file that is missing or lacks the columns an example reads.
Only the examples use this module (the package ``hybridtf`` never imports it).
"""

from __future__ import annotations

import argparse
import csv
import os


def int_at_least(minimum: int):
    """An argparse ``type``: an int >= ``minimum``."""

    def parse(text: str) -> int:
        value = _parse(text, int, "an integer")
        if value < minimum:
            wanted = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)  # steps, epochs, batch sizes, ranks, widths
non_negative_int = int_at_least(0)  # seeds, warm-up steps


def positive_float(text: str) -> float:
    """A finite float > 0 (learning rates)."""
    value = _parse(text, float, "a number")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    """A share in [0, 1): 0 allowed (no held-out rows), 1 not (no training rows would be left)."""
    value = _parse(text, float, "a number")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"must be in [0, 1) (a share of the rows; 0 = evaluate on the training rows), got {text}"
        )
    return value


def existing_file(text: str) -> str:
    """A path to an existing file."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def check_csv_columns(parser: argparse.ArgumentParser, path: os.PathLike | str, columns, data_name: str) -> None:
    """Calls ``parser.error`` unless ``path`` is a CSV file whose header has all of ``columns``."""
    if not os.path.isfile(path):
        parser.error(f"--data {path}: no such file ({data_name} CSV with a header)")
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    missing = [c for c in columns if c not in header]
    if missing:
        shown = ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")
        parser.error(
            f"--data {path} lacks the {data_name} columns {missing} (header: {shown or 'none'}); "
            f"is this {data_name} data?"
        )


def _parse(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None

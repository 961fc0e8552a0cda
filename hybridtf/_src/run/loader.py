"""Loads hybridtf's compiled TensorFlow op library, once, on first use.

The library is built by ``tools/build_ops.py`` (called by ``pip install``) and
sits next to this file as ``_hybridtf_ops*.so``. It embeds a build record
(``HYBRIDTF_BUILD_INFO:{json}:END``) naming the TensorFlow it was compiled
against, which is read from the file before the library is loaded. Set ``HYBRIDTF_OPS_LIBRARY`` to
load another build of the same sources (for example the Bazel one).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sysconfig
import threading
from types import ModuleType

import tensorflow as tf

from hybridtf._src.errors import OpLibraryError

_HERE = pathlib.Path(__file__).resolve().parent
_REBUILD = "pip install --no-build-isolation -e . (in the hybridtf checkout) or python tools/build_ops.py"
_lock = threading.Lock()
_library: ModuleType | None = None


def library_path() -> pathlib.Path:
    """Returns the path of the op library that ``load_ops`` loads."""
    override = os.environ.get("HYBRIDTF_OPS_LIBRARY")
    if override:
        path = pathlib.Path(override)
        if not path.is_file():
            raise OpLibraryError(
                f"HYBRIDTF_OPS_LIBRARY={override} does not exist. Unset it or point it at a built library."
            )
        return path
    path = _HERE / ("_hybridtf_ops" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not path.is_file():
        raise OpLibraryError(
            f"hybridtf's op library is not built ({path.name} is missing in {_HERE}). Fix: {_REBUILD}."
        )
    return path


_RECORD = re.compile(rb"HYBRIDTF_BUILD_INFO:(\{.*?\}):END")


def build_info(path: pathlib.Path) -> dict:
    """Reads the build record embedded in the library file."""
    match = _RECORD.search(pathlib.Path(path).read_bytes())
    if match is None:
        raise OpLibraryError(
            f"{path} has no hybridtf build record; it was not built by hybridtf's build. Fix: {_REBUILD}."
        )
    return json.loads(match.group(1))


def check_tensorflow_version(built_for: str, installed: str = tf.__version__) -> None:
    """Raises OpLibraryError unless the library matches the running TensorFlow."""
    if built_for != installed:
        raise OpLibraryError(
            f"hybridtf's op library was built for TensorFlow {built_for}, but TensorFlow {installed} is installed; "
            f"custom ops only load into the TensorFlow they were compiled against. "
            f"Fix: rebuild with {_REBUILD}, or install tensorflow=={built_for}."
        )


def load_ops() -> ModuleType:
    """Loads the op library (once) and returns its generated op module."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            path = library_path()
            check_tensorflow_version(build_info(path)["tensorflow_version"])
            try:
                _library = tf.load_op_library(str(path))
            except tf.errors.OpError as err:
                raise OpLibraryError(f"loading {path} failed: {err.message}. Fix: {_REBUILD}.") from err
    return _library

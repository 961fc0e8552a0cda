"""Crash-safe checkpoint writing: a kill at any moment of a save leaves the newest complete checkpoint readable.

What TensorFlow writes for a checkpoint prefix ``P`` (``save_weights``, the
Estimator's Saver): the shards in a directory ``P_temp/``, then
``MergeV2Checkpoints`` renames the data files to ``P.data-<i>-of-<n>`` and
writes ``P.index`` in place (truncating the old index), and last the state
file ``checkpoint`` (written to ``checkpoint.tmp<uuid>``, then renamed: atomic)
names the prefix. Saving to a prefix that already holds the newest checkpoint
(Keras ``save_weights`` to a fixed path, ``ModelCheckpoint``, an Estimator
saving again at the step it restored) therefore destroys it before the new
one is complete: a kill in between leaves an index that does not match its
data ("file is too short to be an sstable", DataLossError) and a ``P_temp``
directory.

``protected(prefix)`` makes that overwrite safe:

1. removes what earlier killed saves left (``*_temp`` directories of this
   prefix's family, ``checkpoint.tmp*`` files, unreferenced backups);
2. if the state file names ``P`` (a complete checkpoint), hard-links its
   files to a backup prefix ``P.htf-bak-<id>`` (no copy), points the state
   file at the backup (atomic rename), then unlinks ``P``'s names, so that
   TensorFlow writes new files instead of truncating the backup's index;
3. lets the save run: it writes ``P`` and points the state file at it;
4. removes the backup. A save that raises instead (disk full, a bad path)
   gets ``P``'s old files and the old state file back before the error
   propagates, so ``P`` stays readable by any reader, as after plain
   TensorFlow's failed save.

A kill before step 3 finishes leaves the state file naming the backup, which
is complete; after it, naming ``P``. ``resolve(prefix)`` gives the prefix to
read (the backup when the state file names it) and cleans up what it can (a
read-only directory's leftovers stay: a reader reads what TensorFlow reads).

``atomic_file(path)`` covers single-file formats (``.keras``,
``.weights.h5``): the file is written under a temporary name that keeps the
extension, then renamed over ``path``.

``naming_damage(path)`` turns the errors TensorFlow, h5py and zipfile raise
for a damaged checkpoint (cut short, overwritten: ``IndexError: Read less
bytes than requested``, a checksum mismatch, "not an sstable", "file
signature not found", a bad zip CRC) into one ``DataLossError`` that names
the path and the fix, for the optimized models' ``load_weights``.

Assumes one writer per directory at a time (Horovod: rank 0 writes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
import zipfile

import tensorflow as tf

_log = logging.getLogger("hybridtf")
_BACKUP = ".htf-bak-"
_TMP_FILE = ".htf-tmp"


def _state(directory: str, latest_filename: str | None = None):
    try:
        return tf.train.get_checkpoint_state(directory, latest_filename)
    except (tf.errors.OpError, ValueError):  # unreadable state: treat as none
        return None


def _referenced(directory: str, latest_filename: str | None = None) -> set[str]:
    state = _state(directory, latest_filename)
    if state is None:
        return set()
    paths = [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
    return {os.path.basename(p) for p in paths if p}


def _files_of(prefix: str) -> list[str]:
    return tf.io.gfile.glob(prefix + ".index") + tf.io.gfile.glob(prefix + ".data-?????-of-?????")


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError, tf.errors.NotFoundError):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


@contextlib.contextmanager
def _best_effort(reading: bool, path: str):
    """On a read, a cleanup that cannot write (a read-only mount, another user's directory) is skipped.

    A reader must read what plain TensorFlow reads: an evaluation or serving job that mounts the
    training job's checkpoints read-only failed in ``load_weights`` / an Estimator's restore with
    ``OSError: [Errno 30] Read-only file system`` naming a leftover of a killed save. A save still
    fails on it (it could not write its own files either).
    """
    try:
        yield
    except OSError as err:
        if not reading:
            raise
        _log.debug("hybridtf: left the leftovers of killed saves next to %s as they are (%s)", path, err)


def clean(prefix: str, latest_filename: str | None = None, reading: bool = False) -> None:
    """Removes what killed saves of ``prefix``'s family left: ``*_temp`` dirs, state temporaries, stale backups.

    The family is ``prefix`` and, for a prefix ending in ``-<step>``, every
    ``<stem>-<step>`` (an Estimator's ``model.ckpt-<n>``). Only names of the
    forms TensorFlow and this module create are touched. ``reading``: on a
    read, what cannot be removed stays (``_best_effort``).
    """
    with _best_effort(reading, prefix):
        _clean(prefix, latest_filename)


def _clean(prefix: str, latest_filename: str | None) -> None:
    directory = os.path.dirname(prefix) or "."
    if not os.path.isdir(directory):
        return
    base = os.path.basename(prefix)
    stem, _, step = base.rpartition("-")
    family = re.escape(stem) + r"-\d+" if stem and step.isdigit() else re.escape(base)
    temp_dir = re.compile(family + r"(\.htf-bak-[0-9a-f]{8})?_temp(_[0-9a-f]+)?")
    backup_file = re.compile(r"(" + family + r"\.htf-bak-[0-9a-f]{8})\.(index|data-\d{5}-of-\d{5})")
    state_tmp = re.compile(re.escape(latest_filename or "checkpoint") + r"\.tmp[0-9a-f]{32}")
    referenced = _referenced(directory, latest_filename)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if state_tmp.fullmatch(name) or (temp_dir.fullmatch(name) and os.path.isdir(path)):
            _remove(path)
            continue
        match = backup_file.fullmatch(name)
        if match and match.group(1) not in referenced:
            _remove(path)


def resolve(prefix: str, latest_filename: str | None = None) -> str:
    """The prefix to read for ``prefix``: its backup if a killed save left the state file naming it.

    Also cleans up after killed saves (``clean``).
    """
    prefix = os.fspath(prefix)
    if "://" in prefix:
        return prefix
    directory = os.path.dirname(prefix) or "."
    clean(prefix, latest_filename, reading=True)
    state = _state(directory, latest_filename)
    if state is not None and state.model_checkpoint_path:
        latest = os.path.basename(state.model_checkpoint_path)
        if latest.startswith(os.path.basename(prefix) + _BACKUP):
            candidate = os.path.join(directory, latest)
            if tf.io.gfile.exists(candidate + ".index"):
                return candidate
    return prefix


def _point_state_at(directory: str, prefix: str, latest_filename: str | None) -> None:
    state = _state(directory, latest_filename)
    others = [p for p in (state.all_model_checkpoint_paths if state else []) if os.path.basename(p)]
    tf.__internal__.train.update_checkpoint_state(
        save_dir=directory,
        model_checkpoint_path=prefix,
        all_model_checkpoint_paths=[*others, prefix],
        latest_filename=latest_filename,
        save_relative_paths=True,
    )


@contextlib.contextmanager
def protected(prefix: str, latest_filename: str | None = None):
    """Context for a save that (over)writes TF checkpoint ``prefix``: see the module docstring."""
    prefix = os.fspath(prefix)
    if "://" in prefix:  # remote file systems: TensorFlow's own writing, as is
        yield
        return
    directory = os.path.dirname(prefix) or "."
    backup = before = None
    with _naming_the_save(prefix):
        clean(prefix, latest_filename)
        existing = _files_of(prefix)
        if existing:
            backup = f"{prefix}{_BACKUP}{uuid.uuid4().hex[:8]}"
            _link_all(existing, prefix, backup)
            if os.path.basename(prefix) in _referenced(directory, latest_filename):
                before = _state(directory, latest_filename)
                _point_state_at(directory, backup, latest_filename)
            for path in existing:  # TensorFlow then writes new files, never into the backup's
                _remove(path)
    try:
        yield
    except GeneratorExit:  # the context was abandoned, never left (as by a killed process): nothing to undo
        raise
    except BaseException:  # a save that raised (disk full, ...): the old checkpoint goes back under its name
        if backup is not None:
            _put_back(prefix, backup, before, directory, latest_filename)
        raise
    if backup is not None:
        for path in _files_of(backup):
            _remove(path)
    clean(prefix, latest_filename)  # backups of earlier killed saves, no longer named by the state file


@contextlib.contextmanager
def _naming_the_save(path: str):
    """An ``OSError`` of hybridtf's own steps of a save names the checkpoint, not only a temporary's name."""
    try:
        yield
    except OSError as err:
        if err.errno is None:
            raise
        raise OSError(
            err.errno,
            f"{err.strerror}: hybridtf could not save {path} (at {err.filename or 'a temporary file'}). The "
            "previous checkpoint there, if any, is still readable; free space or make the directory writable "
            "and save again",
        ) from err


def _link_all(paths: list[str], prefix: str, target: str) -> None:
    """Gives each of ``prefix``'s files ``paths`` a second name under ``target`` (a hard link, or a copy)."""
    for path in paths:
        try:
            os.link(path, target + path[len(prefix) :])
        except OSError:  # no hard links on this file system: a copy
            shutil.copy2(path, target + path[len(prefix) :])


def _put_back(prefix: str, backup: str, before, directory: str, latest_filename: str | None) -> None:
    """After a save of ``prefix`` raised: its old files and state back, as plain TensorFlow leaves them.

    The backup is removed only once the state file no longer names it; if putting back fails too
    (the disk is still full), the state file keeps naming the complete backup (``resolve`` reads it).
    """
    try:
        for path in _files_of(prefix):  # what the failed save wrote
            _remove(path)
        _link_all(_files_of(backup), backup, prefix)
        if before is not None:
            tf.__internal__.train.update_checkpoint_state(
                save_dir=directory,
                model_checkpoint_path=before.model_checkpoint_path,
                all_model_checkpoint_paths=list(before.all_model_checkpoint_paths),
                latest_filename=latest_filename,
                save_relative_paths=True,
            )
        for path in _files_of(backup):
            _remove(path)
        clean(prefix, latest_filename)
    except Exception as err:  # the save's own error is the one raised
        _log.warning(
            "hybridtf: the save of checkpoint %s failed, and putting its previous files back failed too (%s); "
            "the previous checkpoint stays complete at %s, which the checkpoint state file names.",
            prefix,
            err,
            backup,
        )


def _stem_and_extension(name: str) -> tuple[str, str]:
    for ext in (".weights.h5", ".keras", ".h5"):
        if name.endswith(ext):
            return name[: -len(ext)], ext
    return os.path.splitext(name)


def clean_file(path, reading: bool = False) -> None:
    """Removes the temporaries that killed ``atomic_file`` saves of ``path`` left (on a read: those it can)."""
    path = os.fspath(path)
    if "://" in path:
        return
    with _best_effort(reading, path):
        _clean_file(path)


def _clean_file(path: str) -> None:
    directory, name = os.path.split(path)
    stem = _stem_and_extension(name)[0]
    if not os.path.isdir(directory or "."):
        return
    for stale in os.listdir(directory or "."):
        if stale.startswith(stem + _TMP_FILE):
            _remove(os.path.join(directory, stale))


@contextlib.contextmanager
def atomic_file(path):
    """Yields a temporary path with ``path``'s extension; renames it over ``path`` once written."""
    path = os.fspath(path)
    if "://" in path:
        yield path
        return
    directory, name = os.path.split(path)
    stem, ext = _stem_and_extension(name)
    tmp = os.path.join(directory, f"{stem}{_TMP_FILE}-{uuid.uuid4().hex[:8]}{ext}")
    try:
        with _naming_the_save(path):
            clean_file(path)
            yield tmp
            os.replace(tmp, path)
    finally:
        _remove(tmp)


@contextlib.contextmanager
def crash_safe_path(filepath, overwrite: bool = True):
    """The path a Keras save should write ``filepath`` at so that a kill never leaves the newest complete save
    unreadable: a temporary file for ``.keras`` / ``.weights.h5`` (``atomic_file``), the prefix itself under
    ``protected`` for the TensorFlow format. Without ``overwrite`` (Keras asks first) or for a non-path (an h5py
    file object), ``filepath`` as is."""
    if not overwrite or not isinstance(filepath, (str, os.PathLike)):
        yield filepath
        return
    path = os.fspath(filepath)
    if path.endswith((".keras", ".weights.h5")):
        with atomic_file(path) as tmp:
            yield tmp
    else:
        with protected(path):
            yield path


_DAMAGE_SIGNS = (
    "read less bytes than requested",
    "sstable",
    "checksum",
    "corrupt",
    "file signature not found",
    "truncated file",
)


def _damaged(err: BaseException) -> bool:
    """Whether ``err``, raised reading a checkpoint, says that its files are damaged (not missing, not of another
    model)."""
    if isinstance(err, (tf.errors.DataLossError, zipfile.BadZipFile)):
        return True
    if isinstance(err, (IndexError, tf.errors.OpError, OSError)):
        text = str(err).lower()
        return any(sign in text for sign in _DAMAGE_SIGNS)
    return False


@contextlib.contextmanager
def naming_damage(filepath):
    """Re-raises an error of reading a damaged checkpoint at ``filepath`` as a ``DataLossError`` naming the path
    and the fix (TensorFlow's own, e.g. ``IndexError: Read less bytes than requested``, names neither)."""
    try:
        yield
    except (IndexError, tf.errors.OpError, OSError, zipfile.BadZipFile) as err:
        if not _damaged(err):
            raise
        path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else repr(filepath)
        raise tf.errors.DataLossError(
            None,
            None,
            f"hybridtf: the checkpoint {path!r} cannot be read: its files are damaged (cut short or overwritten: a "
            f"copy or a disk that failed; {type(err).__name__}: {str(err)[:300]}). Restore an earlier checkpoint "
            "(a CheckpointManager's or ModelCheckpoint's previous one; tf.train.get_checkpoint_state(directory)"
            ".all_model_checkpoint_paths lists a directory's), or copy the files again from where they were "
            "written.",
        ) from err

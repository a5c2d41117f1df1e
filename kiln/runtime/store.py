"""The files of kiln's on-disk cache. Every writer and reader of `$KILN_CACHE_DIR` goes through here.

[Note: a cache safe to share] What the cache holds runs in the user's process: host programs are
Python source, C++ kernels are shared libraries, Triton kernels are Python files Triton imports.
So:

- The directory (`$KILN_CACHE_DIR`, default `~/.cache/kiln`) is created private to the user
  (0700). A directory, or a folder in it, owned by another user or writable by group or others
  (its parent too, unless the parent is sticky like /tmp) is not used: one warning says why, and
  kiln compiles without the disk cache for the rest of the process.
- Every entry is written to a temporary file in its own folder and renamed into place
  (`os.replace`), so processes compiling the same program at once never see half an entry, and
  the last writer's complete entry wins.
- Every entry carries a sha256 of its content (a header line for data entries; an index entry for
  a shared library). A truncated or corrupted entry is detected before use, removed, reported in
  one warning, and its program is compiled again.
- Entries are data (JSON) or source text; no Python object is ever deserialized from the cache.

Kinds of entry: data (`read_json`/`write_json`: a checksummed JSON document), libraries
(`library`/`put_library`: a binary whose checksum an index entry holds), and source files
(`source_file`: a file whose text must equal what the caller printed, for importers that need a
path). Where the cache is not used, libraries and source files live in a private temporary folder
of this process (`scratch`).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from typing import Any

_HEADER = b"kiln-entry sha256:"
_LOCK = threading.Lock()
_CHECKED: dict[str, str | None] = {}      # path -> None (usable) or why not (warned once)
_SCRATCH: list[str] = []


def configured_root() -> str:
    return os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")


def _unsafe(path: str, parent: bool = False) -> str | None:
    """Why `path` must not be trusted, or None. Follows links: what matters is the folder written."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if parent and st.st_mode & stat.S_ISVTX:
        return None                      # /tmp: others may write, but not rename our folder
    if st.st_uid != os.getuid() and not (parent and st.st_uid == 0):
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by {'group and others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _check(path: str, create: bool) -> bool:
    """Whether `path` may be used (created 0700 when missing); warns once per path when not."""
    with _LOCK:
        if path in _CHECKED:
            return _CHECKED[path] is None
        why = None
        try:
            if create:
                os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            why = f"it cannot be created ({e.strerror})"
        why = why or _unsafe(path)
        if why is None:
            parent = os.path.dirname(os.path.abspath(path))
            pw = _unsafe(parent, parent=True)
            if pw is not None:
                why = f"its parent {parent} is not private: {pw}"
        _CHECKED[path] = why
    if why is not None:
        warnings.warn(f"kiln: not using the cache directory {path}: {why}. Anyone who can write there could "
                      "run code in this process, so kiln compiles without the disk cache. Fix the "
                      f"directory (chmod 700, owned by you) or set KILN_CACHE_DIR to a private one.",
                      stacklevel=3)
    return why is None


def disabled() -> bool:
    return bool(os.environ.get("KILN_DISABLE_CACHE"))


def root() -> str | None:
    """The checked cache directory, or None when the cache is off or not safe to use."""
    if disabled():
        return None
    path = configured_root()
    return path if _check(path, create=True) else None


def folder(kind: str) -> str | None:
    """`<root>/<kind>`, created 0700 and checked, or None when the cache is not used."""
    base = root()
    if base is None:
        return None
    path = os.path.join(base, kind)
    return path if _check(path, create=True) else None


def scratch(kind: str) -> str:
    """A private folder of this process, for files that must exist on disk when the cache is off."""
    with _LOCK:
        if not _SCRATCH:
            _SCRATCH.append(tempfile.mkdtemp(prefix="kiln-"))     # mkdtemp: mode 0700
            atexit.register(shutil.rmtree, _SCRATCH[0], True)
    path = os.path.join(_SCRATCH[0], kind)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def workspace(kind: str) -> str:
    """Where files of `kind` go: the cache's folder, else this process's scratch folder."""
    return folder(kind) or scratch(kind)


def _atomic_write(path: str, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


def _corrupt(path: str, why: str) -> None:
    warnings.warn(f"kiln: the cache entry {path} is corrupted ({why}); it was removed and its program "
                  "is compiled again", stacklevel=4)
    with _suppress():
        os.unlink(path)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(kind: str, name: str, payload: bytes) -> None:
    """Keep `payload` as the entry `kind/name`, with its checksum (a no-op when the cache is off)."""
    base = folder(kind)
    if base is not None:
        _atomic_write(os.path.join(base, name), _HEADER + _digest(payload).encode() + b"\n" + payload)


def read(kind: str, name: str) -> bytes | None:
    """The payload of entry `kind/name`, or None when missing; a corrupted one is warned about,
    removed, and read as missing."""
    base = folder(kind)
    if base is None:
        return None
    path = os.path.join(base, name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    head, sep, payload = data.partition(b"\n")
    if not sep or not head.startswith(_HEADER):
        _corrupt(path, "no checksum header")
        return None
    if _digest(payload) != head[len(_HEADER):].decode(errors="replace"):
        _corrupt(path, f"checksum mismatch, {len(payload)} bytes")
        return None
    return payload


def write_json(kind: str, name: str, value: Any) -> None:
    write(kind, name, json.dumps(value, sort_keys=True).encode())


def read_json(kind: str, name: str) -> Any | None:
    payload = read(kind, name)
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except ValueError:      # the checksum held, so the writer wrote this: a bug, not corruption
        return None


def library(kind: str, key: str) -> str | None:
    """The path of the verified shared library cached under `key`, or None."""
    index = read_json(kind, f"{key}.index")
    if not isinstance(index, dict):
        return None
    name, digest = index.get("file"), index.get("sha256")
    if not isinstance(name, str) or os.path.basename(name) != name or not isinstance(digest, str):
        return None                      # not an index this module wrote: build afresh
    path = os.path.join(folder(kind), name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if _digest(data) != digest:
        _corrupt(path, f"checksum mismatch, {len(data)} bytes")
        with _suppress():
            os.unlink(os.path.join(folder(kind), f"{key}.index"))
        return None
    return path


def put_library(kind: str, key: str, built: str) -> str:
    """Move the freshly built file `built` into the cache under `key` (named by its content, so a
    concurrent writer of other bytes never replaces a file another process verified); returns the
    path to load. Without the cache, the file stays where it was built."""
    base = folder(kind)
    if base is None:
        return built
    with open(built, "rb") as f:
        digest = _digest(f.read())
    name = f"{key}-{digest[:16]}{os.path.splitext(built)[1]}"
    path = os.path.join(base, name)
    if os.path.exists(path):
        os.unlink(built)
    else:
        os.replace(built, path)
    write_json(kind, f"{key}.index", {"file": name, "sha256": digest})
    return path


def source_file(kind: str, name: str, text: str) -> str:
    """A path whose file holds exactly `text` (for importers that read a file: Triton's JIT). An
    existing file is used only when its text is `text`; otherwise it is written afresh."""
    path = os.path.join(workspace(kind), name)
    data = text.encode()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
    except FileNotFoundError:
        pass
    _atomic_write(path, data)
    return path


def build_dir(kind: str) -> str:
    """A fresh private folder (in the cache when used) for a compiler's inputs and outputs; the
    caller removes it with `remove_tree`."""
    return tempfile.mkdtemp(prefix=".build-", dir=workspace(kind))


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def forget_checks() -> None:
    """Check directories again (tests change `KILN_CACHE_DIR` and permissions within a process)."""
    with _LOCK:
        _CHECKED.clear()

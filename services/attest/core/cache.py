"""Vectors of fixed texts, computed once per model and kept on disk.

The knowledge graph's names and aliases are embedded by the KG scorer and by
the entity linker, in every process that starts either, although the vectors
depend only on the texts and the model. ``text_vectors`` computes them once:
within a process the arrays are shared, and across processes they are read
from ``<cache dir>/vectors/<key>.npy``.

The key is a SHA-256 of the texts and of the model's *fingerprint*: the
vectors the model gives a few fixed probe texts, rounded (``fingerprint``), so
any change of model, weights, version or normalisation gives another key
without anyone having to name the model. The fingerprint comes from the object
that embeds: ``encode`` is used as is when it is, or is bound to, or wraps (as
its ``encoder`` or ``_encoder``) an object with a ``vector_fingerprint()``
method (the ``Embedder`` has one). Any other ``encode`` (a test's toy encoder)
is simply called: nothing is cached for it.

Files are written to a temporary name and renamed, so a reader sees a whole
file or none; a file that cannot be read, or whose shape or values are wrong,
is ignored (and replaced). The cache lives in ``$ATTEST_CACHE_DIR``, else
``$XDG_CACHE_HOME/attest``, else ``~/.cache/attest``; ``ATTEST_CACHE_DIR=off``
turns the disk cache off (the in-process sharing stays).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
Encode = Callable[[Sequence[str]], Vectors]

# Texts whose vectors identify a model: short, unlike each other, fixed forever.
PROBES: tuple[str, ...] = (
    "Greenhouse gas emissions of the supply chain.",
    "quarterly dividend",
    "Wer reitet so spät durch Nacht und Wind?",
)
# Decimals of the probe vectors that go into the fingerprint: coarse enough that
# thread counts and instruction sets (last-bit differences) give the same key.
FINGERPRINT_DECIMALS = 3
_FORMAT = b"attest-text-vectors-1"

_shared: dict[str, Vectors] = {}
_key_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def cache_dir() -> Path | None:
    """Where vectors are kept on disk; None when the disk cache is off."""
    configured = os.environ.get("ATTEST_CACHE_DIR")
    if configured is not None:
        if configured.strip().lower() in ("", "off", "none", "0"):
            return None
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attest"


def fingerprint(encode: Encode) -> str:
    """A hex digest of what ``encode`` makes of the probe texts."""
    probes = np.asarray(encode(list(PROBES)), dtype=np.float32)
    # +0.0 turns -0.0 into 0.0, which rounds small negative noise to one value.
    rounded = np.round(probes.astype(np.float64), FINGERPRINT_DECIMALS) + 0.0
    digest = hashlib.sha256(_FORMAT)
    digest.update(str(probes.shape).encode())
    digest.update(rounded.tobytes())
    return digest.hexdigest()


def fingerprint_of(encode: Encode) -> str | None:
    """The fingerprint of the model behind ``encode``, if it can tell (see above)."""
    holders: list[object] = [encode]
    bound = getattr(encode, "__self__", None)
    if bound is not None:
        holders.append(bound)
    for holder in list(holders):
        for name in ("encoder", "_encoder"):
            inner = getattr(holder, name, None)
            if inner is not None:
                holders.append(inner)
    for holder in holders:
        method = getattr(holder, "vector_fingerprint", None)
        if callable(method):
            return str(method())
    return None


def vectors_key(texts: Sequence[str], model_fingerprint: str) -> str:
    digest = hashlib.sha256(_FORMAT)
    digest.update(model_fingerprint.encode())
    digest.update(len(texts).to_bytes(8, "little"))
    for text in texts:
        raw = text.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def _read(path: Path, rows: int) -> Vectors | None:
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as exc:
        log.warning("ignoring unreadable vector cache %s: %s", path, exc)
        return None
    if (
        array.dtype != np.float32
        or array.ndim != 2
        or array.shape[0] != rows
        or not np.all(np.isfinite(array))
    ):
        log.warning("ignoring vector cache %s: shape %s %s", path, array.shape, array.dtype)
        return None
    out: Vectors = array
    return out


def _write(path: Path, array: Vectors) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, array, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        # A cache that cannot be written costs time, never correctness.
        log.warning("could not write vector cache %s: %s", path, exc)


def _checked(encoded: object, rows: int) -> Vectors:
    vectors: Vectors = np.ascontiguousarray(encoded, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != rows:
        raise ValueError(
            f"encode returned shape {vectors.shape} for {rows} texts; expected one row per text"
        )
    return vectors


def _lock(key: str) -> threading.Lock:
    with _locks_lock:
        return _key_locks.setdefault(key, threading.Lock())


def text_vectors(
    texts: Sequence[str], encode: Encode, model_fingerprint: str | None = None
) -> Vectors:
    """``encode(texts)`` as float32 rows, from this process's or the disk's cache when
    the same texts were embedded by the same model before (the model's fingerprint
    is ``model_fingerprint``, else found as the module docstring says; without one
    nothing is cached). A cached array is shared: it is read-only."""
    texts = list(texts)
    model_fingerprint = model_fingerprint or fingerprint_of(encode)
    if model_fingerprint is None:
        return _checked(encode(texts), len(texts))
    key = vectors_key(texts, model_fingerprint)
    with _lock(key):
        hit = _shared.get(key)
        if hit is not None:
            return hit
        root = cache_dir()
        path = root / "vectors" / f"{key}.npy" if root is not None else None
        vectors = _read(path, len(texts)) if path is not None else None
        if vectors is None:
            vectors = _checked(encode(texts), len(texts))
            if path is not None:
                _write(path, vectors)
        vectors.setflags(write=False)
        _shared[key] = vectors
        return vectors


def forget_shared() -> None:
    """Drop the in-process copies (tests; the disk cache stays)."""
    with _locks_lock:
        _shared.clear()
        _key_locks.clear()


class VectorMemo:
    """Vectors of many short texts (organization names), one file of them per model.

    ``vectors(texts, encode)`` embeds only the texts the memo has not seen, in one
    call, and rewrites the file (atomically) when it learnt any. The file holds
    a model fingerprint; under another model it is ignored and replaced, and so
    is a file that cannot be read. Vectors are keyed by the text alone, so they
    never go stale whatever is indexed or deleted. At most ``capacity`` texts are
    kept (texts past it are embedded every time). Keep the file with the data it
    was made from (it holds their texts).
    """

    def __init__(self, path: Path, *, capacity: int = 200_000) -> None:
        self.path = path
        self.capacity = capacity
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        self._rows: dict[str, Vectors] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def _load(self, model: str) -> None:
        self._fingerprint = model
        self._rows = {}
        try:
            with np.load(self.path, allow_pickle=False) as data:
                if str(data["fingerprint"]) != model:
                    return
                texts, vectors = data["texts"], data["vectors"]
                if (
                    vectors.dtype != np.float32
                    or vectors.ndim != 2
                    or len(texts) != len(vectors)
                    or not np.all(np.isfinite(vectors))
                ):
                    raise ValueError(f"bad arrays {texts.shape} {vectors.shape} {vectors.dtype}")
                self._rows = {str(t): v for t, v in zip(texts, vectors, strict=True)}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("ignoring unreadable vector memo %s: %s", self.path, exc)

    def _save(self) -> None:
        texts = list(self._rows)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.stem}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez(
                        f,
                        fingerprint=np.array(self._fingerprint),
                        texts=np.array(texts, dtype=str),
                        vectors=np.vstack([self._rows[t] for t in texts]),
                    )
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("could not write vector memo %s: %s", self.path, exc)

    def retain(self, texts: Iterable[str]) -> int:
        """Forget every text but ``texts`` (the names of the articles still indexed, so
        that a deleted article's names leave the disk too); returns how many went."""
        keep = set(texts)
        with self._lock:
            if self._fingerprint is None and not keep:
                # Never read (no names seen at all): nothing of the file is kept.
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                return 0
            gone = [t for t in self._rows if t not in keep]
            for text in gone:
                del self._rows[text]
            if gone and self._fingerprint is not None:
                if self._rows:
                    self._save()
                else:
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
            return len(gone)

    def vectors(self, texts: Sequence[str], encode: Encode) -> Vectors:
        """``encode(texts)``, embedding only the texts not seen before (one call)."""
        model = fingerprint_of(encode)
        if model is None:
            return _checked(encode(list(texts)), len(texts))
        with self._lock:
            if self._fingerprint != model:
                self._load(model)
            missing = [t for t in dict.fromkeys(texts) if t not in self._rows]
            if missing:
                new = _checked(encode(missing), len(missing))
                room = max(0, self.capacity - len(self._rows))
                extra = dict(zip(missing, new, strict=True))
                self._rows.update(dict(list(extra.items())[:room]))
                if room:
                    self._save()
            else:
                extra = {}
            if not texts:
                return np.zeros((0, 0), np.float32)
            rows = [self._rows[t] if t in self._rows else extra[t] for t in texts]
            out: Vectors = np.vstack(rows)
            return out

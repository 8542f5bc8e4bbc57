"""The disk tier: chunks as zstd records in diskcache, with an SQLite index of them.

diskcache keeps the bytes (LRU within a size budget); ``DiskTier.put`` encodes a
chunk (``_codec``: header, zstd, checksum) and ``read_into`` verifies it on the way
back. ``index.db`` (``_index``) remembers each chunk's parent, start and tokens so
that a new process can look prefixes up without reading any blob. Order of writes:
blob first, index row second, so a crash in between leaves an orphan blob (evicted
in time), never an index row pointing at nothing we trust; and a row whose blob is
gone (evicted, deleted by hand) is dropped on first use.

What the tier holds (chunks, tokens, bytes on disk) is counted by whoever changes
it, as it writes, culls and deletes, after one count at open: a stats scrape
reads the last ``DiskUsage`` and never lists the cache or walks its folder.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
import numpy as np

from .._private import private_dir, private_file
from ..errors import CacheError, ConfigError, DiskFull, DiskUnavailable, WarmstartError
from . import _codec
from ._index import DiskIndex, IndexRow

log = logging.getLogger(__name__)

# what SQLite's write-ahead logs may grow by between two writes' checks (their
# checkpoint comes at 1,000 pages): room kept below the budget, at most an eighth of it
WAL_GROWTH = 4 << 20


def _allocated(path: str) -> int:
    """Bytes a file really occupies (its allocated blocks), 0 once it is gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    return getattr(info, "st_blocks", 0) * 512 or info.st_size


class PrivateDisk(diskcache.Disk):
    """diskcache's Disk with private files (0600, directories 0700): KV caches hold
    the user's conversations. Values reach it already encoded (DiskTier.put), as
    plain bytes, which diskcache keeps raw (unpickled).

    Each value file is counted as it is written and as diskcache removes it (a
    replaced value, an LRU cull, a delete), so ``file_bytes`` is known without a walk.
    """

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        self._files: dict[str, int] = {}  # relative file name -> allocated bytes
        self._files_lock = threading.Lock()  # diskcache removes from any thread
        self.file_bytes = 0

    def count_files(self) -> None:
        """The one walk: the value files already there when the tier opens."""
        found = {}
        for root, _dirs, files in os.walk(self._directory):
            for name in files:
                full = os.path.join(root, name)
                if root != self._directory:  # diskcache's own cache.db* sit at the top
                    found[os.path.relpath(full, self._directory)] = _allocated(full)
        with self._files_lock:
            self._files, self.file_bytes = found, sum(found.values())

    def _counted(self, filename: str, nbytes: int) -> None:
        with self._files_lock:
            self.file_bytes += nbytes - self._files.pop(filename, 0)
            if nbytes:
                self._files[filename] = nbytes

    def filename(
        self, key: Any = diskcache.core.UNKNOWN, value: Any = diskcache.core.UNKNOWN
    ) -> Any:
        """diskcache's two levels of sub-directories, created here 0700 (its own
        makedirs follows the umask, 0755 under a usual one, before our chmod of the file)."""
        filename, full_path = super().filename(key, value)
        outer = os.path.join(self._directory, os.path.dirname(os.path.dirname(filename)))
        for directory in (outer, os.path.dirname(full_path)):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
        return filename, full_path

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        size, mode, filename, db_value = super().store(value, read, key=key)
        if filename:
            full = os.path.join(self._directory, filename)
            os.chmod(full, 0o600)
            self._counted(filename, _allocated(full))
        return size, mode, filename, db_value

    def remove(self, file_path: str) -> None:
        super().remove(file_path)
        self._counted(file_path, 0)


@dataclass(frozen=True)
class DiskUsage:
    """What the disk tier holds now: its indexed chunks whose blob is there, their
    tokens and KV bytes, and the bytes its folder occupies (allocated blocks)."""

    chunks: int = 0
    tokens: int = 0
    kv_bytes: int = 0
    used_bytes: int = 0


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EIO)
# sqlite3 says it in words only: a read-only file system, a vanished directory,
# a damaged index (a "file is not a database" is a DatabaseError)
_SQLITE_UNWRITABLE = ("readonly", "disk i/o", "unable to open", "not a database", "malformed")


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc)


def _is_unwritable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in _UNWRITABLE
    text = str(exc).lower()
    return isinstance(exc, sqlite3.DatabaseError) and any(w in text for w in _SQLITE_UNWRITABLE)


def disk_problem(directory: Path, exc: BaseException) -> CacheError:
    """The CacheError for a failure of the cache directory as a whole."""
    if isinstance(exc, WarmstartError) and exc.__cause__ is not None:
        exc = exc.__cause__  # judged by what the file system or SQLite said
    if _is_disk_full(exc):
        return DiskFull(f"the cache disk is full ({directory})")
    if isinstance(exc, ConfigError | DiskUnavailable) or _is_unwritable(exc):
        return DiskUnavailable(f"cannot use the disk cache in {directory}: {exc}")
    return CacheError(f"disk cache in {directory}: {exc}")


def directory_problem(directory: Path) -> str | None:
    """Why a disk tier could not write in ``directory`` now, or None when it can
    (for `warmstart doctor`; it opens no database)."""
    try:
        private_dir(directory, "cache_dir")
        probe = directory / ".probe"
        probe.write_bytes(b"warmstart")
        probe.unlink()
    except (OSError, ConfigError) as exc:
        return str(disk_problem(directory, exc))
    return None


def drop_chunks(directory: Path, keys: set[bytes]) -> None:
    """Deletes these chunks' blobs and index rows, with no model loaded (diskcache
    opened with the settings it stored: the size budget stays the server's)."""
    if not keys or not (directory / "index.db").is_file():
        return
    blobs = diskcache.Cache(str(directory / "blobs"), disk=PrivateDisk)
    index = DiskIndex(directory / "index.db")
    try:
        for key in keys:
            blobs.delete(key.hex(), retry=True)
        index.delete(keys)
    finally:
        blobs.close()
        index.close()


def reset_directory(directory: Path) -> None:
    """Deletes what a DiskTier keeps in ``directory`` (its index and blobs), whatever
    state they are in, and nothing else: `warmstart cache clear` on a damaged cache."""
    for name in ("index.db", "index.db-wal", "index.db-shm"):
        (directory / name).unlink(missing_ok=True)
    blobs = directory / "blobs"
    if blobs.is_symlink() or blobs.is_file():
        blobs.unlink()
    elif blobs.is_dir():
        shutil.rmtree(blobs)


def _as_unavailable(directory: Path, exc: BaseException) -> DiskUnavailable:
    problem = disk_problem(directory, exc)
    if isinstance(problem, DiskUnavailable):
        return problem
    # opening failed for another reason (a damaged file): unusable all the same
    return DiskUnavailable(f"cannot open the disk cache in {directory}: {exc}")


class DiskTier:
    """Chunk records under one cache directory, for one model fingerprint."""

    def __init__(self, directory: Path, fingerprint: str, level: int, budget_bytes: int) -> None:
        """Raises DiskUnavailable (DiskFull) when the directory cannot be used: the
        caller runs from RAM and tries again later."""
        self.directory = directory
        self.level = level
        self._fp = _codec.fingerprint_digest(fingerprint)
        self._lock = threading.Lock()  # the counts below: the writer and readers change them
        self._culled: set[bytes] = set()  # culled by diskcache, not yet told to the store
        self._budget = self._limit = budget_bytes  # the folder's, and diskcache's share
        try:
            # a symlink or another user's directory is refused, never followed and re-moded
            private_dir(directory, "cache_dir")
            self._index = DiskIndex(directory / "index.db")
        except (OSError, sqlite3.Error, ConfigError, WarmstartError) as exc:
            raise _as_unavailable(directory, exc) from exc
        try:
            self._blobs = diskcache.Cache(
                str(directory / "blobs"),
                disk=PrivateDisk,
                size_limit=budget_bytes,
                eviction_policy="least-recently-used",
                cull_limit=16,
                statistics=False,
            )
            (directory / "blobs").chmod(0o700)
            for suffix in ("", "-wal", "-shm"):  # diskcache's own index, created by it
                private_file(directory / "blobs" / f"cache.db{suffix}")
            self._count_at_open()
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            if hasattr(self, "_blobs"):
                with contextlib.suppress(Exception):
                    self._blobs.close()
            self._index.close()
            raise _as_unavailable(directory, exc) from exc

    # what the tier holds, counted as it changes -----------------------------------
    def _count_at_open(self) -> None:
        """The one listing and walk: the chunks indexed whose blob is really there
        (diskcache's LRU culls blobs without telling the index), and the files."""
        self._disk: PrivateDisk = self._blobs.disk
        self._disk.count_files()
        self._sqlite_files = [
            self.directory / f"{name}{suffix}"
            for name in ("index.db", "blobs/cache.db")
            for suffix in ("", "-wal", "-shm")
        ]
        known = {str(p) for p in self._sqlite_files}
        blobs = self.directory / "blobs"
        self._other_bytes = sum(  # anything else in the folder (a user's file): fixed
            _allocated(os.path.join(root, name))
            for root, _dirs, files in os.walk(self.directory)
            for name in files
            if os.path.join(root, name) not in known and not root.startswith(str(blobs))
        )
        present = self.present()
        self._chunks: dict[bytes, tuple[int, int]] = {}  # key -> (tokens, KV bytes)
        self._tokens = self._kv_bytes = 0
        self._n_blobs = len(self._blobs)
        for row in self._index.rows(self._fp):
            if row.key in present:
                self._add(row.key, len(row.tokens), row.nbytes)
        self._publish()

    def _add(self, key: bytes, tokens: int, nbytes: int) -> None:
        self._discard(key)
        self._chunks[key] = (tokens, nbytes)
        self._tokens += tokens
        self._kv_bytes += nbytes

    def _discard(self, key: bytes) -> None:
        tokens, nbytes = self._chunks.pop(key, (0, 0))
        self._tokens -= tokens
        self._kv_bytes -= nbytes

    def _publish(self) -> None:
        """After each change (lock held or not yet shared): the SQLite files grow with
        every write and read (diskcache records access times), so they are looked at
        again; six stats, never a listing."""
        used = self._other_bytes + self._disk.file_bytes
        used += sum(_allocated(str(p)) for p in self._sqlite_files)
        self.usage = DiskUsage(len(self._chunks), self._tokens, self._kv_bytes, used)

    def _settle(self, key: bytes, tokens: int | None = None, nbytes: int = 0) -> None:
        """Records that ``key`` was written (``tokens`` given) or went, and finds the
        chunks diskcache culled meanwhile to keep its budget: it says which only by
        its count falling, so the keys are listed then, on eviction, not per scrape.
        The culled keys' index rows are dropped; ``take_culled`` hands them over."""
        with self._lock:
            had = key in self._chunks
            if tokens is None:
                self._discard(key)
            else:
                self._add(key, tokens, nbytes)
            expected = self._n_blobs + (tokens is not None and not had) - (tokens is None and had)
            self._n_blobs = len(self._blobs)
            if self._n_blobs < expected:
                culled = set(self._chunks) - self.present()
                for gone in culled:
                    self._discard(gone)
                self._index.delete(culled)
                self._culled |= culled
            self._publish()

    def _fit_limit(self) -> None:
        """diskcache keeps its values and cache.db within its size limit, but counts
        neither the SQLite write-ahead logs nor index.db nor the blocks its files round
        up to (the soak run's folder reached 168.6 MiB against a budget of 160): its
        limit is the budget less those as they stand, less room for the logs to grow,
        set again before a write when that moved, so the write culls to it."""
        with self._lock:
            uncounted = max(0, self.usage.used_bytes - self._blobs.volume())
        room = min(WAL_GROWTH, self._budget // 8)
        limit = max(self._budget // 4, self._budget - uncounted - room)
        if abs(limit - self._limit) >= max(64 << 10, self._budget >> 8):
            self._blobs.reset("size_limit", limit)
            self._limit = limit

    def take_culled(self) -> set[bytes]:
        """The keys diskcache culled since the last call (their blobs are gone)."""
        with self._lock:
            culled, self._culled = self._culled, set()
        return culled

    def writable(self) -> bool:
        """Whether a small file can be written and synced here now (the way back
        from a degraded tier: space freed, the file system writable again)."""
        probe = self.directory / ".probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, bytes(256 << 10))  # room for more than a record header
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError:
            return False
        return True

    def rows(self) -> Iterator[IndexRow]:
        """Every indexed chunk of this fingerprint whose blob is there (none is read)."""
        for row in self._index.rows(self._fp):
            if row.key in self._chunks:
                yield row

    def put(self, row: IndexRow, payload: bytes | memoryview) -> bytes:
        """Encodes one chunk (header, zstd, checksum: ``_codec``) and writes it through;
        returns its key. Raises DiskFull or CacheError (nothing half-indexed)."""
        record = _codec.encode(payload, row.key, self._fp, self.level, row.logits)
        try:
            self._fit_limit()
            self._blobs.set(row.key.hex(), record)
            self._index.put(self._fp, row)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            self._settle(row.key)  # whatever of it landed is counted, the chunk is not
            if _is_disk_full(exc) or _is_unwritable(exc):
                raise disk_problem(self.directory, exc) from exc
            raise CacheError(f"cannot write chunk {row.key.hex()}: {exc}") from exc
        self._settle(row.key, len(row.tokens), row.nbytes)
        return row.key

    def read_into(self, key: bytes, out: np.ndarray, logits: int = 0) -> int | None:
        """Reads the chunk's bytes straight from its file into ``out``, verified;
        returns their length, or None when the blob is gone. ``logits``: the bytes of
        logits its index row says end them (a record that says otherwise is not the
        one indexed). A corrupt, truncated or foreign record raises CacheError after
        being deleted."""
        try:
            handle = self._blobs.get(key.hex(), default=None, read=True, retry=True)
        except Exception as exc:  # whatever a damaged file makes diskcache raise
            self.delete(key)
            raise CacheError(f"cannot read chunk {key.hex()}: {exc}") from exc
        if handle is None:
            self._drop_row(key)
            return None
        if isinstance(handle, bytes | bytearray):  # small records live inside SQLite
            handle = io.BytesIO(handle)
        try:
            with handle:
                header = _codec.header_from(handle)
                if header.logits != logits:
                    raise CacheError(f"record keeps {header.logits} bytes of logits, not {logits}")
                n = _codec.read_into(handle, header, self._fp, key, out)
            with self._lock:
                self._publish()  # the read moved the chunk up diskcache's LRU: a write
            return n
        except (CacheError, OSError) as exc:
            self.delete(key)
            if isinstance(exc, CacheError):
                raise
            raise CacheError(f"cannot read chunk {key.hex()}: {exc}") from exc

    def get(self, key: bytes) -> bytes | None:
        """The chunk's KV bytes (a copy); see read_into."""
        nbytes = self._index.nbytes(key)
        out = np.empty(1 << 26 if nbytes is None else nbytes, dtype=np.uint8)
        n = self.read_into(key, out)
        return None if n is None else out[:n].tobytes()

    def delete(self, key: bytes) -> None:
        try:
            self._blobs.delete(key.hex(), retry=True)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            log.warning("could not delete chunk %s: %s", key.hex(), exc)
        self._drop_row(key)

    def _drop_row(self, key: bytes) -> None:
        self._index.delete((key,))
        self._settle(key)

    def present(self) -> set[bytes]:
        """Keys whose blob really exists now (a listing: at open and after a cull)."""
        return {bytes.fromhex(k) for k in self._blobs.iterkeys() if isinstance(k, str)}

    def bytes_on_disk(self) -> int:
        """Bytes the cache directory really occupies, by walking it (``usage`` is the
        same figure, counted; this is the check)."""
        return sum(
            _allocated(os.path.join(root, name))
            for root, _dirs, files in os.walk(self.directory)
            for name in files
        )

    def clear(self) -> None:
        self._blobs.clear(retry=True)
        self._index.clear()
        with self._lock:
            self._chunks.clear()
            self._tokens = self._kv_bytes = 0
            self._n_blobs = len(self._blobs)
            self._publish()

    def close(self) -> None:
        self._blobs.close()
        self._index.close()

"""The people of a household server: one key each, in a keys file (pure but for the file).

The file (``keys.json`` in the data dir, 0600) lists each user's name, a salted hash
of the key and the user's cache salt; the key itself is printed once by ``warmstart
keys add`` and written nowhere. Keys are 32 random bytes, so one salted BLAKE2b is
enough: there is no dictionary to try a fast hash against (a slow hash would cost
every request its time instead).

A request's caller is the user whose key it carries. Without a keys file (or with an
empty one) nothing changes from a single-user install: the one ``api_key``, or none
on loopback, means the one local user, whose conversations and caches are those of
earlier versions (owner ``""``, no cache salt).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ConfigError

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
KEY_PREFIX = "wsk-"
NAME_RULE = "a user name is 1 to 32 letters, digits, '-' or '_', starting with a letter"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}\Z")


@dataclass(frozen=True)
class Caller:
    """Who a request comes from. ``owner`` scopes conversations and stored responses
    ("" the local user of a single-user install); ``cache_scope`` seeds the chunk keys
    of the user's KV cache ("" the unsalted keys of a single-user install)."""

    name: str = ""
    owner: str = ""
    cache_scope: str = ""


LOCAL = Caller()


@dataclass(frozen=True)
class User:
    name: str
    salt: str  # hex, for the key's hash
    key_hash: str  # hex
    cache_salt: str  # hex, random: a user removed and added again starts a new cache
    created: float
    # users of one group share their KV cache (conversations stay private): an opt-in
    # for prompts that are public by nature, such as a shared system prompt
    cache_group: str | None = None

    def caller(self) -> Caller:
        scope = f"group:{self.cache_group}" if self.cache_group else f"user:{self.cache_salt}"
        return Caller(self.name, f"user:{self.name}", scope)


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"user name {name!r}: {NAME_RULE}")
    return name


def _hash(salt: str, key: str) -> str:
    data = bytes.fromhex(salt) + key.encode("utf-8")
    return hashlib.blake2b(data, digest_size=32, person=b"warmstart-key").hexdigest()


def new_user(name: str, cache_group: str | None = None) -> tuple[User, str]:
    """A user and the key to hand them (the only time it exists in clear)."""
    if cache_group is not None:
        check_name(cache_group)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    user = User(check_name(name), salt, _hash(salt, key), secrets.token_hex(16), time.time())
    if cache_group is not None:
        user = User(**{**asdict(user), "cache_group": cache_group})
    return user, key


def find_user(users: tuple[User, ...], key: str) -> User | None:
    """The user whose key this is. Every entry is compared, in constant time each, so
    the time taken says nothing about which user (or how much of a key) matched."""
    found = None
    for user in users:
        if hmac.compare_digest(_hash(user.salt, key), user.key_hash):
            found = user
    return found


def read_users(path: Path) -> tuple[User, ...]:
    """The users of a keys file; none when it does not exist. A file that cannot be
    read or parsed is a ConfigError: the server must not fall back to no keys."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise ConfigError(f"keys_file: cannot read {path}: {exc}") from exc
    try:
        data = json.loads(raw)
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT_VERSION}")
        return tuple(User(**entry) for entry in data["users"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"keys_file: {path} is not a warmstart keys file: {exc}") from exc


def write_users(path: Path, users: tuple[User, ...]) -> None:
    """Replaces the keys file at once (a reader sees the old or the new one), 0600 from
    its creation, in a folder only its owner may enter."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = {"format": FORMAT_VERSION, "users": [asdict(u) for u in users]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(body, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_user(path: Path, name: str, cache_group: str | None = None) -> str:
    """Adds a user and returns their key; a name already there is a ConfigError."""
    users = read_users(path)
    if any(u.name == name for u in users):
        raise ConfigError(f"user {name!r} already has a key; remove it first to replace it")
    user, key = new_user(name, cache_group)
    write_users(path, (*users, user))
    return key


def remove_user(path: Path, name: str) -> bool:
    users = read_users(path)
    kept = tuple(u for u in users if u.name != name)
    if len(kept) == len(users):
        return False
    write_users(path, kept)
    return True


class KeyBook:
    """The keys file as the server sees it: read again when it changed (its size,
    mtime or inode differ: a ``keys add`` replaces it) or when ``reload()`` is called
    (SIGHUP), so keys take effect without a restart. A file that became unreadable
    keeps the users read last, and the problem is returned by ``reload``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self.users: tuple[User, ...] = ()
        self.reload()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def reload(self) -> None:
        """Reads the file now; raises ConfigError when it cannot (the users read last
        stay)."""
        stamp = self._stamp()
        self.users = read_users(self.path) if stamp is not None else ()
        self._seen = stamp

    def current(self) -> tuple[User, ...]:
        """The users, read again first if the file changed."""
        stamp = self._stamp()
        if stamp != self._seen:
            try:
                self.reload()
            except ConfigError as exc:
                self._seen = stamp  # said once, not at every request
                log.error("%s; the keys read before stay in use", exc)
        return self.users

"""The running server's note in the data dir: how the command line finds it.

``warmstart serve`` writes ``server.json`` (0600) once it listens: its pid, where it
listens and whether it asks for a key (never the key). ``cache``, ``sessions`` and the
other commands that ask a running server first read it when no ``--port`` is given,
so a server on another port is found through the data dir they share. A clean
shutdown removes it; a note whose process is gone is ignored (a crash leaves one
behind), and so is one whose port does not answer (the caller checks that).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..settings import CREDENTIAL_NAME, Settings

log = logging.getLogger(__name__)
NAME = "server.json"
FORMAT = 1


@dataclass(frozen=True)
class Running:
    pid: int
    host: str
    port: int
    scheme: str  # "http" or "https"
    key_required: bool


def note_path(data_dir: Path) -> Path:
    return data_dir / NAME


def write_note(data_dir: Path, running: Running) -> Path:
    """Atomic (a reader never sees half of it), 0600 like everything in the data dir."""
    path = note_path(data_dir)
    tmp = path.with_name(f".{NAME}.{running.pid}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, **asdict(running)}, f)
    os.replace(tmp, path)
    return path


def remove_note(data_dir: Path, pid: int) -> None:
    """Removes the note if it is this process's: a second server sharing the data
    dir may have written its own since."""
    found = _read(note_path(data_dir))
    if found is not None and found.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            note_path(data_dir).unlink()


def read_note(data_dir: Path) -> Running | None:
    """The note of a server whose process still exists, else None."""
    found = _read(note_path(data_dir))
    if found is None or not _alive(found.pid):
        return None
    return found


def _read(path: Path) -> Running | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        return Running(
            int(data["pid"]),
            str(data["host"]),
            int(data["port"]),
            str(data["scheme"]),
            bool(data["key_required"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.debug("ignoring the server note %s: %s", path, exc)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user (a service's server)
        return True
    return True


def local_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``, as a URL
    writes it (a wildcard bind answers on loopback too)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def key_source(settings: Settings) -> str:
    """Where the server's API key came from, for the introduction (never the key)."""
    if settings.api_key_file is not None:
        return f"the key in {settings.api_key_file}"
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials and (Path(credentials) / CREDENTIAL_NAME).is_file():
        return f"the key in {Path(credentials) / CREDENTIAL_NAME}"
    return "the key given by --api-key, WARMSTART_API_KEY or the config file"


def introduction(settings: Settings, running: Running, model: str) -> str:
    """What ``warmstart serve`` says once it listens: the URLs to give clients and
    whether they need a key."""
    base = f"{running.scheme}://{local_host(running.host)}:{running.port}"
    where = f"{running.host}:{running.port}"
    if settings.host in ("0.0.0.0", "::", ""):
        where += " (every address of this machine)"
    if running.key_required:
        key = f"required: send 'Authorization: Bearer KEY', {key_source(settings)}"
    else:
        key = "not needed (loopback only)"
    return "\n".join(
        [
            f"warmstart is serving {model} on {where}",
            f"  OpenAI base URL  {base}/v1",
            f"  Ollama URL       {base}  (OLLAMA_HOST={base})",
            f"  API key          {key}",
            f"  server note      {note_path(settings.data_dir)} (how `warmstart cache` finds it)",
        ]
    )

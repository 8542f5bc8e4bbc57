"""Downloads that users can trust: resumable, with progress, space-checked and hashed.

The hub's side (URLs, auth headers, file metadata, HF_ENDPOINT) goes through
huggingface_hub; the bytes go to ``<file>.part`` next to the destination, so a
pull killed halfway continues where it stopped on the next run (an HTTP Range
request). Only a file whose SHA-256 matches (or, with no known hash, whose hash
was reported) is renamed into place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import certifi
import httpx
from tqdm import tqdm

from ..errors import Cancelled, ModelError

log = logging.getLogger(__name__)
SPACE_MARGIN = 256 << 20  # left free on the disk after the download: the cache lives there too
BLOCK = 1 << 20


def tls() -> ssl.SSLContext:
    """The system's trust store (what pip and curl trust, corporate proxies' CAs
    included) plus certifi's, for Pythons that ship without one; httpx alone would
    trust certifi's only."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(certifi.where())
    return ctx


@dataclass(frozen=True)
class Source:
    url: str
    filename: str
    size: int | None  # from the server; None when it does not say
    sha256: str | None
    headers: dict[str, str] = field(default_factory=dict)
    label: str = ""  # what the progress bar calls it (default: the file name)


@dataclass(frozen=True)
class Watch:
    """A download followed from outside the terminal (the app's picker): ``progress``
    gets (bytes done, bytes in all or None) after every block, on the downloading
    thread; setting ``cancel`` from any thread stops it at the next block with
    :class:`~.errors.Cancelled`, keeping the ``.part`` so the next pull resumes."""

    progress: Callable[[int, int | None], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def update(self, done: int, total: int | None) -> None:
        if self.cancel.is_set():
            raise Cancelled("the download was cancelled; it resumes where it stopped")
        if self.progress is not None:
            self.progress(done, total)


def _offline(where: str, exc: Exception) -> ModelError:
    return ModelError(f"cannot download from {where}: offline or unreachable ({exc})")


def hub_source(repo: str, filename: str, revision: str, sha256: str | None) -> Source:
    """A file on the hub (or on HF_ENDPOINT), with its size from the hub."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import build_hf_headers

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
    headers = build_hf_headers()
    try:
        meta = get_hf_file_metadata(url, headers=headers, endpoint=endpoint)
    except HfHubHTTPError as exc:
        raise ModelError(f"the hub refused {repo}/{filename}@{revision}: {exc}") from exc
    except (OSError, httpx.HTTPError) as exc:
        raise _offline(endpoint, exc) from exc
    except Exception as exc:  # huggingface_hub wraps transport errors in its own types
        raise _offline(endpoint, exc) from exc
    return Source(meta.location, filename, meta.size, sha256, headers)


def url_source(url: str) -> Source:
    # plain http only from this machine (a local mirror): elsewhere anyone on the path
    # could swap the weights, and most URLs come with no hash to check
    if not url.startswith(("https://", "http://127.0.0.1:", "http://localhost:")):
        raise ModelError(f"{url}: only https:// URLs are pulled")
    filename = url.rsplit("/", 1)[-1].split("?", 1)[0]
    if not filename.endswith(".gguf"):
        raise ModelError(f"{url}: expected a URL ending in FILE.gguf")
    try:
        head = httpx.head(url, follow_redirects=True, timeout=30, verify=tls())
        head.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise ModelError(f"{url}: {exc.response.status_code} from the server") from exc
    except httpx.HTTPError as exc:
        raise _offline(url, exc) from exc
    size = head.headers.get("content-length")
    return Source(str(head.url), filename, int(size) if size else None, None)


def check_space(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if needed + SPACE_MARGIN > free:
        raise ModelError(
            f"not enough disk space in {directory}: the download needs {needed / 1e9:.2f} GB "
            f"more and {free / 1e9:.2f} GB are free"
        )


def download(
    source: Source, dest: Path, progress: bool | None = None, watch: Watch | None = None
) -> tuple[Path, str]:
    """``source`` into ``dest``, resuming ``dest.part``; returns (path, sha256).
    ``progress``: the terminal's bar (default: when stderr is one); ``watch``: the
    same figures for a caller, and its cancel."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    if source.size is not None:
        if have > source.size:  # not this file's beginning: start over
            part.unlink()
            have = 0
        check_space(dest.parent, source.size - have)
    show = sys.stderr.isatty() if progress is None else progress
    if source.size is None or have < source.size:
        _fetch(source, part, have, show, watch or Watch())
    digest = _sha256(part)
    if source.sha256 is not None and digest != source.sha256:
        part.unlink()
        raise ModelError(
            f"{source.filename}: SHA-256 {digest} is not the expected {source.sha256}; "
            "the download was deleted"
        )
    if source.sha256 is None:
        log.warning("%s has no known SHA-256 to check; it hashed to %s", source.filename, digest)
    os.replace(part, dest)  # atomic: a half-written model is never seen under its name
    return dest, digest


def _fetch(source: Source, part: Path, have: int, show: bool, watch: Watch) -> None:
    headers = dict(source.headers)
    if have:
        headers["Range"] = f"bytes={have}-"
    bar = tqdm(
        total=source.size, initial=have, unit="B", unit_scale=True,
        desc=source.label or source.filename, disable=not show,
    )  # fmt: skip
    try:
        with (
            httpx.stream(
                "GET", source.url, headers=headers, follow_redirects=True, timeout=60, verify=tls()
            ) as r,
            part.open("r+b" if have else "wb") as f,
        ):
            if r.status_code == 416 or r.status_code >= 400:
                raise ModelError(f"{source.filename}: the server answered {r.status_code}")
            if have and r.status_code != 206:  # the server ignored the range: start over
                have = 0
                bar.reset(total=source.size)
            f.seek(have)
            f.truncate()
            watch.update(have, source.size)
            # as the bytes come (not in BLOCK-sized pieces), so that progress moves and a
            # cancel is seen on a slow line; a stalled one is seen at the read timeout
            for block in r.iter_bytes():
                f.write(block)
                f.flush()  # on disk as it comes: a kill keeps every byte received
                have += len(block)
                bar.update(len(block))
                watch.update(have, source.size)
    except httpx.HTTPError as exc:
        if watch.cancel.is_set():  # the connection failed after the user stopped it
            raise Cancelled("the download was cancelled; it resumes where it stopped") from exc
        raise _offline(source.url.split("/", 3)[2], exc) from exc
    finally:
        bar.close()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(BLOCK):
            h.update(chunk)
    return h.hexdigest()

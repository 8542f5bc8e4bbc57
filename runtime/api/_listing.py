"""The models a server answers with, for both dialects' listings (/v1/models,
/api/tags, /api/show, /api/ps): the loaded one first, then every other installed
model, from their GGUF headers (cached) without loading any."""

from __future__ import annotations

from dataclasses import dataclass

from ..models import DigestCache, InstalledModel, describe
from ._state import AppState


@dataclass(frozen=True)
class ServedModel:
    name: str
    info: InstalledModel | None  # None: the loaded model's file is unknown (a fake runtime)
    loaded: bool
    n_ctx: int | None  # the context this server gave it; None until it has loaded it
    digest: str  # the file's SHA-256 where it was computed before (loading does), else ""


def served_models(st: AppState) -> list[ServedModel]:
    digests = DigestCache(st.settings.data_dir / "digests.json")
    loaded = ServedModel(
        st.model_name,
        describe(st.model_name, st.model_path, st.metadata) if st.model_path else None,
        not st.unloaded,  # keep_alive may have unloaded it
        st.runtime.n_ctx,
        (digests.known(st.model_path) or "") if st.model_path else "",
    )
    others = [
        ServedModel(
            name,
            describe(name, path, st.metadata),
            False,
            st.served_ctx.get(path.resolve()),
            digests.known(path) or "",
        )
        for name, path in st.installed().items()
        if name != st.model_name and path.resolve() != st.model_path
    ]
    return [loaded, *others]

"""The model, loaded once per process: resolved (pulled on first use), digested, and
opened with the llama.cpp options that a smoke decode and a smoke load showed safe on
this machine (runtime/engine/_smoke.py, _loader.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..engine import (
    AS_SET,
    NOT_CHECKED,
    ExtraBuffers,
    LlamaModel,
    LoaderChoice,
    LoaderCommand,
    SmokeCommand,
    choose_extra_buffers,
    choose_loader,
    gpu_offload_supported,
)
from ..models import DigestCache, ModelManager
from ..policy import ModelGeometry
from ..settings import Settings


@dataclass(frozen=True)
class LoadedModel:
    path: Path
    digest: str
    model: LlamaModel
    extra_buffers: ExtraBuffers = NOT_CHECKED
    loader: LoaderChoice = AS_SET


def load_model(
    settings: Settings,
    smoke: SmokeCommand | None = None,
    loader_smoke: LoaderCommand | None = None,
    gpu_offload: bool | None = None,
) -> LoadedModel:
    """Resolves (pulling the default model on first use), digests and loads the model,
    with llama.cpp's extra buffer types only where a smoke decode (``smoke``: its
    child's command, for tests) showed them safe, and the loader's choices (mmap,
    pinned staging, offload) that a smoke load (``loader_smoke``) lived through.
    ``gpu_offload``: whether the build can offload (None: ask it; tests say True)."""
    path = ModelManager(settings.models_dir).resolve(settings.model)
    digest = DigestCache(settings.data_dir / "digests.json").digest(path)
    extra = choose_extra_buffers(
        settings.extra_buffers, path, digest, settings.data_dir / "extra_buffers.json", smoke
    )
    loader = choose_loader(
        mmap=settings.mmap,
        pinned=settings.pinned_staging,
        n_gpu_layers=settings.n_gpu_layers,
        model=path,
        digest=digest,
        extra_buffers=extra.enabled,
        cache_file=settings.data_dir / "loader.json",
        gpu_offload=gpu_offload_supported() if gpu_offload is None else gpu_offload,
        command=loader_smoke,
    )
    loader.apply_env()
    model = LlamaModel(path, loader.n_gpu_layers, extra_buffers=extra.enabled, mmap=loader.mmap)
    return LoadedModel(path, digest, model, extra, loader)


def geometry_of(model: LlamaModel, type_kv: str) -> ModelGeometry:
    return ModelGeometry(
        n_ctx_train=model.n_ctx_train,
        n_layer=model.n_layer,
        kv_bytes_per_token=model.kv_bytes_per_token_estimate(type_kv),
        model_bytes=model.path.stat().st_size,
        swa=model.n_swa > 0,
        recurrent=model.recurrent,
    )

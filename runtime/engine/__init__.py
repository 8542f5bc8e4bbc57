"""The engine: llama.cpp behind one ``Engine`` protocol (``LlamaEngine``), and a small
deterministic ``FakeEngine`` behind the same protocol for tests; chat templates, tools,
grammars, the loader and the smoke check of llama.cpp's buffers.

Names load on first use: the fake engine and the light parts never import llama.cpp.
"""

from typing import TYPE_CHECKING

from .._lazy import on_first_use as _on_first_use

if TYPE_CHECKING:
    from ._build import llama_build_info
    from ._engine import EngineConfig, LlamaEngine, fingerprint_of
    from ._fake import CELL_BYTES, FakeEmbedder, FakeEngine, FakeOptions
    from ._grammars import json_object_grammar, json_schema_grammar
    from ._kvblob import CacheLayout
    from ._llama import LlamaEmbedder, LlamaModel, on_own_thread
    from ._loader import AS_SET, LoaderChoice, LoaderCommand, choose_loader, gpu_offload_supported
    from ._protocol import Engine, Prompter, TokenSampler
    from ._residents import Resident
    from ._sampling import token_logprob
    from ._smoke import NOT_CHECKED, ExtraBuffers, SmokeCommand, choose_extra_buffers
    from ._template import ChatTemplate
    from ._text import TextAssembler
    from ._tools import ToolPlan, arguments_value, check_choice

__all__ = [
    "AS_SET",
    "CELL_BYTES",
    "NOT_CHECKED",
    "CacheLayout",
    "ChatTemplate",
    "Engine",
    "EngineConfig",
    "ExtraBuffers",
    "FakeEmbedder",
    "FakeEngine",
    "FakeOptions",
    "LlamaEmbedder",
    "LlamaEngine",
    "LlamaModel",
    "LoaderChoice",
    "LoaderCommand",
    "Prompter",
    "Resident",
    "SmokeCommand",
    "TextAssembler",
    "TokenSampler",
    "ToolPlan",
    "arguments_value",
    "check_choice",
    "choose_extra_buffers",
    "choose_loader",
    "fingerprint_of",
    "gpu_offload_supported",
    "json_object_grammar",
    "json_schema_grammar",
    "llama_build_info",
    "on_own_thread",
    "token_logprob",
]

_WHERE = {
    "AS_SET": "._loader",
    "CELL_BYTES": "._fake",
    "CacheLayout": "._kvblob",
    "ChatTemplate": "._template",
    "Engine": "._protocol",
    "EngineConfig": "._engine",
    "ExtraBuffers": "._smoke",
    "FakeEmbedder": "._fake",
    "FakeEngine": "._fake",
    "FakeOptions": "._fake",
    "LlamaEmbedder": "._llama",
    "LlamaEngine": "._engine",
    "LlamaModel": "._llama",
    "LoaderChoice": "._loader",
    "LoaderCommand": "._loader",
    "Prompter": "._protocol",
    "NOT_CHECKED": "._smoke",
    "Resident": "._residents",
    "SmokeCommand": "._smoke",
    "TextAssembler": "._text",
    "TokenSampler": "._protocol",
    "ToolPlan": "._tools",
    "arguments_value": "._tools",
    "check_choice": "._tools",
    "choose_extra_buffers": "._smoke",
    "choose_loader": "._loader",
    "fingerprint_of": "._engine",
    "gpu_offload_supported": "._loader",
    "json_object_grammar": "._grammars",
    "json_schema_grammar": "._grammars",
    "llama_build_info": "._build",
    "on_own_thread": "._llama",
    "token_logprob": "._sampling",
}

__getattr__ = _on_first_use(__name__, _WHERE)

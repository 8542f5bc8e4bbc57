"""The base of every Ollama request body: strict types, and unknown fields kept so
that a refusal can name them (Ollama's clients send fields warmstart may not have)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ._errors import unsupported


class Body(BaseModel):
    # "allow" so that unknown fields can be named in the refusal (see refuse_extras)
    model_config = ConfigDict(strict=True, extra="allow")

    def refuse_extras(self, prefix: str = "") -> None:
        for name, value in (self.model_extra or {}).items():
            if value is not None:  # null asks for nothing
                raise unsupported(prefix + name)

"""The user's choices: which server, which model, sampling and threshold overrides.

Kept in the conversation store's ``preferences`` table (one JSON value per field), so
they move with the conversations, except the API key: it goes to a
:class:`~app.core.secret_store.SecretStore` (the OS keyring or a 0600 file), never
into the database. Window geometry is Qt's business (``QSettings``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

from .api import DEFAULT_BASE_URL
from .secret_store import SecretStore
from .types import Sampling

SECRET_FIELDS = frozenset({"api_key"})


class PreferenceStore(Protocol):
    def preference(self, key: str, default: Any = None) -> Any: ...

    def set_preference(self, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class Preferences:
    base_url: str = DEFAULT_BASE_URL
    api_key: str = ""
    autostart: bool = True  # start ``warmstart serve`` when nothing answers on loopback
    model: str = ""  # "" = the server's default; else a model id or a GGUF path
    sampling: Sampling = field(default_factory=Sampling)
    system_prompt: str = ""
    # drafts sent while typing (issue 40): "auto" (on, off on battery), "on", "off"
    drafts: str = "auto"
    # Threshold overrides by setting name; applied as WARMSTART_<NAME> when the app
    # starts the local server. Absent = automatic (the server's policy decides).
    overrides: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, store: PreferenceStore, secrets: SecretStore | None = None) -> Preferences:
        base = cls()
        values: dict[str, Any] = {}
        if secrets is not None:
            values["api_key"] = secrets.get()
        for f in fields(cls):
            if f.name in SECRET_FIELDS:
                continue
            raw = store.preference(f.name)
            if raw is None:
                continue
            if f.name == "sampling" and isinstance(raw, dict):
                known = {k: v for k, v in raw.items() if k in Sampling.__dataclass_fields__}
                if "stop" in known:
                    known["stop"] = tuple(known["stop"])
                values[f.name] = replace(base.sampling, **known)
            else:
                values[f.name] = raw
        return replace(base, **values)

    def save(self, store: PreferenceStore, secrets: SecretStore | None = None) -> None:
        """Without ``secrets`` the key is not saved at all."""
        for key, value in asdict(self).items():
            if key not in SECRET_FIELDS:
                store.set_preference(key, value)
        if secrets is not None and secrets.get() != self.api_key:
            secrets.set(self.api_key)

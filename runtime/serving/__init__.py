"""The serving runtime: one request admitted once, queued, prefilled from the longest
cached prefix, decoded and kept (``LocalRuntime``), and the factory that builds every
runtime (``open_runtime`` over the model, ``open_fake_runtime`` over the fake engine).

Names load on first use: the parts over the fake engine never import llama.cpp.
"""

from typing import TYPE_CHECKING

from .._lazy import on_first_use as _on_first_use

if TYPE_CHECKING:
    from ._admit import Admitted, check_request, check_sampling
    from ._core import LocalRuntime
    from ._factory import model_opener, open_fake_runtime, open_runtime, plan
    from ._load import load_model
    from ._service import Runtime
    from ._sessions import (
        MAX_SESSION_ID,
        SESSION_ID_RULE,
        SessionBook,
        check_session_id,
        derived_session_id,
        new_session_id,
        session_id_problem,
    )
    from ._stats import Stats

__all__ = [
    "MAX_SESSION_ID",
    "SESSION_ID_RULE",
    "Admitted",
    "LocalRuntime",
    "Runtime",
    "SessionBook",
    "Stats",
    "check_request",
    "check_sampling",
    "check_session_id",
    "derived_session_id",
    "load_model",
    "model_opener",
    "new_session_id",
    "open_fake_runtime",
    "open_runtime",
    "plan",
    "session_id_problem",
]

_WHERE = {
    "Admitted": "._admit",
    "LocalRuntime": "._core",
    "MAX_SESSION_ID": "._sessions",
    "Runtime": "._service",
    "SESSION_ID_RULE": "._sessions",
    "SessionBook": "._sessions",
    "Stats": "._stats",
    "check_request": "._admit",
    "check_sampling": "._admit",
    "check_session_id": "._sessions",
    "derived_session_id": "._sessions",
    "load_model": "._load",
    "model_opener": "._factory",
    "new_session_id": "._sessions",
    "open_fake_runtime": "._factory",
    "open_runtime": "._factory",
    "plan": "._factory",
    "session_id_problem": "._sessions",
}

__getattr__ = _on_first_use(__name__, _WHERE)

"""The runtime's seam: what the CLI, the HTTP API and the tests call.

``LocalRuntime`` (runtime/serving/_core.py) implements it, over the llama.cpp engine or over
the fake engine (runtime/engine/_fake.py, no model), so the layers above run in tests
without a model. Both pass the same contract tests (tests/serving/test_service_contract.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..types import Budget, Draft, Embeddings, Request, SessionInfo, StoredResponse, Stream
from ._admit import Admitted


@runtime_checkable
class Runtime(Protocol):
    """Contract:

    - ``admit(request, budget)`` admits it once (runtime/serving/_admit.py: the rules, the
      session id, the tool plan, the prompt's tokens, the one overflow rule, the reply
      budget sized from the prompt when a ``Budget`` is given; raising RequestError,
      ContextOverflow, Busy) and returns the frozen ``Admitted``. ``count_tokens(r)``
      is the prompt's tokens, the whole conversation before any trimming; it queues
      nothing (never Busy).
    - ``generate(request)`` takes a Request (admitted at once) or an ``Admitted`` of
      this runtime's, and returns a Stream; the work happens on the runtime's own
      thread and the stream yields Token events then exactly one Done.
    - Requests for different conversations may be submitted from many threads; the
      runtime serves them fairly and raises Busy when ``max_queue`` are waiting.
    - ``sessions(search)`` lists known conversations, newest first, with per-tier
      tokens; a ``search`` keeps those whose title or messages contain it. Those of
      requests that named no session (``session_id`` None: a derived id) are left
      out unless ``anonymous``; ``session(id)`` finds them either way.
    - ``prefill_draft(request)`` computes, as background work, the part of a chat's
      prompt that its final version is certain to share (the message being typed
      may still change), and waits for it; returns a ``Draft`` (how many tokens are
      ready, and why it stopped: a newer draft of the conversation, a request).
    - ``prewarm(id)`` promotes a conversation's cached chunks to RAM; returns tokens
      promoted (0 when unknown or uncached). ``delete_session(id)`` forgets it and
      drops chunks no other conversation uses; returns False when unknown.
    - ``rename_session(id, title)`` gives a conversation the user's title (later turns
      keep it); False when unknown. ``import_sessions(infos)`` adds conversations kept
      elsewhere (their ids, titles, times and messages; no KV), all at once or none;
      an id already known is left unchanged and gives False, so an import can be
      repeated.
    - ``keep_response(r)`` keeps a Responses API reply under its id (replacing one of
      the same id); False, nothing kept, where no conversation text is kept (history
      off). ``response(id)`` reads one back (None when unknown);
      ``delete_response(id)`` forgets one (False when unknown). Deleting a session
      forgets the responses kept in it.
    - ``stats()`` returns the JSON of a ``_stats.Stats``: counters and tier usage.
    - ``settings_report()`` returns ``{name: {"value": v, "reason": str}}``.
    - ``degraded()`` returns ``{part: why}`` for what runs in a reduced mode now (the
      disk tier off: RAM only); empty when all is well. Cheap: /health calls it.
    - ``clear_cache()`` empties the KV cache in every tier (a damaged disk cache is
      reset); conversations stay.
    - ``embed(texts, stop)`` returns one unit-length vector per text (Embeddings),
      computed on the calling thread while replies go on; raises RequestError (param
      ``input``) for an empty text, one too long to embed, or a request over the
      limits of runtime/_embed_queue.py, before any vector is computed. It waits its
      turn counted among the waiting requests (Busy when ``max_queue`` wait) and is
      active while computed; ``stop`` set, or cancel_all(), ends it before its next
      text with Cancelled. Its vectors name ``embedding_model_id``.
    - ``tokenize(text, add_special, parse_special)`` returns the model's token ids of
      ``text`` (``add_special``: with the BOS/EOS the model adds; ``parse_special``:
      control tokens written in the text are read as such); ``pieces(ids)`` returns each
      id's bytes (control tokens as their text), raising RequestError (param
      ``tokens``) for an id outside the vocabulary. Both are cheap, off the queue.
    - ``cancel_all()`` ends every reply in progress as cancelled (a server shutting
      down); each stream still ends with its Done. Embeddings end with Cancelled.
    - ``wait_idle(timeout)`` waits until every submitted request has finished;
      False when ``timeout`` seconds passed first (a model switch bounds its wait).
    - ``close()`` stops the worker and flushes the disk tier; idempotent. A request
      submitted after close() is refused (a WarmstartError), never left waiting.
    """

    model_id: str
    embedding_model_id: str  # the model /v1/embeddings answers with
    n_ctx: int

    def admit(self, request: Request, budget: Budget | None = None) -> Admitted: ...

    def generate(self, request: Request | Admitted) -> Stream: ...

    def count_tokens(self, request: Request) -> int: ...

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]: ...

    def pieces(self, ids: Sequence[int]) -> list[bytes]: ...

    def sessions(
        self, search: str = "", anonymous: bool = False, owner: str = ""
    ) -> list[SessionInfo]: ...

    def session(self, session_id: str, owner: str = "") -> SessionInfo | None: ...

    def prewarm(self, session_id: str, *, owner: str = "") -> int: ...

    def prefill_draft(self, request: Request) -> Draft: ...

    def delete_session(self, session_id: str, owner: str = "") -> bool: ...

    def rename_session(self, session_id: str, title: str, owner: str = "") -> bool: ...

    def import_sessions(self, infos: Sequence[SessionInfo], owner: str = "") -> list[bool]: ...

    def keep_response(self, response: StoredResponse, owner: str = "") -> bool: ...

    def response(self, response_id: str, owner: str = "") -> StoredResponse | None: ...

    def delete_response(self, response_id: str, owner: str = "") -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def embed(self, texts: Sequence[str], stop: threading.Event | None = None) -> Embeddings: ...

    def settings_report(self) -> dict[str, dict[str, Any]]: ...

    def degraded(self) -> dict[str, str]: ...

    def cancel_all(self) -> None: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...

    def clear_cache(self) -> None: ...

    def close(self) -> None: ...

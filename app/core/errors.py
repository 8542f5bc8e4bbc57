"""The app's one exception tree. Foreign errors (httpx, sqlite3) are wrapped where they enter.

::

    AppError
    ├── ServerUnavailable       nothing answers at the base URL (refused, timed out, DNS)
    ├── UntrustedServer         something answers where the app's own server should, but
    │                           it is not that server: it gets neither messages nor key
    ├── ProtocolError           something answered, but not in the OpenAI shape
    ├── StoreError              the local conversation database cannot be used
    ├── DownloadFailed          a model download could not finish (offline, checksum, space)
    ├── DownloadCancelled       the user stopped a download; its partial file is kept
    └── ApiError                the server answered with an OpenAI-shaped error (4xx/5xx)
        ├── AuthError           401/403: the API key is missing or wrong
        ├── ModelMissing        404 on the model, or code ``model_not_found``
        ├── ContextFull         code ``context_length_exceeded``
        ├── RateLimited         429; ``retry_after`` in seconds when the server said
        └── ServerBusy          503: loading the model, or overloaded
"""

from __future__ import annotations


class AppError(Exception):
    """Base of every error the app's core raises."""


class ServerUnavailable(AppError):
    def __init__(self, base_url: str, detail: str = "") -> None:
        super().__init__(f"no server answers at {base_url}" + (f" ({detail})" if detail else ""))
        self.base_url = base_url
        self.detail = detail


class UntrustedServer(AppError):
    """What answers at the base URL is not the server the app started (or expects).

    Raised before the app's key or any message is sent to it."""

    def __init__(self, base_url: str, reason: str) -> None:
        super().__init__(f"refused the server at {base_url}: {reason}")
        self.base_url = base_url
        self.reason = reason


class ProtocolError(AppError):
    """The server's reply could not be understood (not JSON, not an OpenAI shape)."""


class StoreError(AppError):
    """The local database is unreadable, or was written by a newer app."""


class DownloadFailed(AppError):
    """A model download could not finish (offline, refused, wrong checksum, no space)."""


class DownloadCancelled(AppError):
    """The user stopped a download; its partial file stays, so the next one resumes."""


class ApiError(AppError):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after


class AuthError(ApiError):
    pass


class ModelMissing(ApiError):
    pass


class ContextFull(ApiError):
    pass


class RateLimited(ApiError):
    pass


class ServerBusy(ApiError):
    pass


def api_error_class(status: int, code: str | None, type_: str | None) -> type[ApiError]:
    """Pick the subclass from the status and the error's code/type, never from its text."""
    if code == "context_length_exceeded":
        return ContextFull
    if code == "model_not_found" or (status == 404 and type_ in {"model_not_found", "not_found"}):
        return ModelMissing
    if status in (401, 403):
        return AuthError
    if status == 429:
        return RateLimited
    if status == 503:
        return ServerBusy
    return ApiError


def describe(error: BaseException) -> str:
    """A sentence a user can act on."""
    if isinstance(error, ServerUnavailable):
        return (
            f"The server at {error.base_url} is not answering. "
            "The app keeps trying and reconnects as soon as it is back."
        )
    if isinstance(error, UntrustedServer):
        return (
            f"Refused the server at {error.base_url}: {error.reason}. The app sent it "
            "neither your messages nor its key. Stop whatever listens there, or, to use "
            "a server you run yourself, turn off “Start a local server” in Settings and "
            "give its URL and key."
        )
    if isinstance(error, ContextFull):
        return (
            "This conversation no longer fits in the model's context. "
            "Start a new conversation, or edit and shorten the last message."
        )
    if isinstance(error, ModelMissing):
        return f"The model is not available on the server: {error.message}"
    if isinstance(error, AuthError):
        return "The server refused the API key. Check it in Settings."
    if isinstance(error, RateLimited):
        wait = f" Try again in {error.retry_after:g} s." if error.retry_after else ""
        return "The server is busy with other requests." + wait
    if isinstance(error, ServerBusy):
        return f"The server is not ready yet: {error.message}"
    if isinstance(error, ApiError):
        return f"The server reported an error ({error.status}): {error.message}"
    if isinstance(error, ProtocolError):
        return f"The server's reply could not be understood: {error}"
    return str(error) or type(error).__name__

"""The app's logic without Qt: the API client, where conversations live (the server's
store, or the app's own file), the report sentences, the local-server launcher and
the model listing. Tested with plain pytest."""

from .api import DEFAULT_BASE_URL, SESSION_HEADER, ApiClient
from .errors import (
    ApiError,
    AppError,
    AuthError,
    ContextFull,
    DownloadCancelled,
    DownloadFailed,
    ModelMissing,
    ProtocolError,
    RateLimited,
    ServerBusy,
    ServerUnavailable,
    StoreError,
    describe,
)
from .history import History, ServerHistory
from .launcher import LocalServer, is_loopback, serve_command
from .memory import MemorySnapshot, TierUsage, parse_stats
from .models import LocalListing, LocalModels, ModelInfo, merge
from .report import TIER_LABELS, TIERS, ReplyReport, format_bytes, format_degraded, format_status
from .store import Conversation, ConversationStore, StoredMessage
from .types import (
    Backend,
    ChatEvent,
    ChatStream,
    Finished,
    Health,
    Sampling,
    ServerSetting,
    SessionMessage,
    SessionSummary,
    TextDelta,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "SESSION_HEADER",
    "TIERS",
    "TIER_LABELS",
    "ApiClient",
    "ApiError",
    "AppError",
    "AuthError",
    "Backend",
    "ChatEvent",
    "ChatStream",
    "ContextFull",
    "Conversation",
    "ConversationStore",
    "DownloadCancelled",
    "DownloadFailed",
    "Finished",
    "Health",
    "History",
    "LocalListing",
    "LocalModels",
    "LocalServer",
    "MemorySnapshot",
    "ModelInfo",
    "ModelMissing",
    "ProtocolError",
    "RateLimited",
    "ReplyReport",
    "Sampling",
    "ServerBusy",
    "ServerHistory",
    "ServerSetting",
    "ServerUnavailable",
    "SessionMessage",
    "SessionSummary",
    "StoreError",
    "StoredMessage",
    "TextDelta",
    "TierUsage",
    "describe",
    "format_bytes",
    "format_degraded",
    "format_status",
    "is_loopback",
    "merge",
    "parse_stats",
    "serve_command",
]

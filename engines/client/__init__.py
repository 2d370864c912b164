"""The one client of an engine's HTTP API (``http``: ``EngineClient``, its docstring says how it
waits), what it sends and reads (``answers``) and the errors it raises (``errors``)."""

from engines.client.answers import (
    EngineChunk,
    EngineMeta,
    EngineOutput,
    generate_body,
    meta_parsed,
)
from engines.client.errors import (
    EngineError,
    EngineOverloaded,
    EngineRejected,
    EngineTimedOut,
    EngineUnavailable,
)
from engines.client.http import (
    ANSWER_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    HEALTH_PATH,
    READ_TIMEOUT_S,
    EngineClient,
    EngineTimeouts,
    engine_client,
)

__all__ = [
    "ANSWER_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "HEALTH_PATH",
    "READ_TIMEOUT_S",
    "EngineChunk",
    "EngineClient",
    "EngineError",
    "EngineMeta",
    "EngineOutput",
    "EngineOverloaded",
    "EngineRejected",
    "EngineTimedOut",
    "EngineTimeouts",
    "EngineUnavailable",
    "engine_client",
    "generate_body",
    "meta_parsed",
]

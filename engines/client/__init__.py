"""The one client of an engine's HTTP API (``http``: ``EngineClient``, its docstring says how it
waits), what it sends and reads (``answers``) and the errors it raises (``errors``)."""

from engines.client.answers import EngineChunk, EngineMeta, EngineOutput, generate_body
from engines.client.errors import (
    EngineError,
    EngineOverloaded,
    EngineRejected,
    EngineTimedOut,
    EngineUnavailable,
)
from engines.client.http import EngineClient, EngineTimeouts, engine_client

__all__ = [
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
]

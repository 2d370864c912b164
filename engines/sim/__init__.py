"""The simulated engine: the default engine, and the benchmark's instrument."""

from .config import EngineConfig, settings_split
from .engine import Engine, SimRequest

__all__ = ["Engine", "EngineConfig", "SimRequest", "settings_split"]

"""The simulated engine: the embedded default engine, and the benchmark's instrument."""

from .config import EngineConfig
from .engine import Engine, SimRequest, StepResult

__all__ = ["Engine", "EngineConfig", "SimRequest", "StepResult"]

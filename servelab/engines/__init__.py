"""Engine adapters, one module each, and the registry that names them."""

from __future__ import annotations

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.llamacpp import LlamaCppEmbedded
from servelab.errors import UserError

# One line per engine.
REGISTRY: dict[str, type[EngineAdapter]] = {
    LlamaCppEmbedded.name: LlamaCppEmbedded,
}


def get_engine(name: str) -> EngineAdapter:
    try:
        return REGISTRY[name.lower()]()
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise UserError(f"unknown engine '{name}'", hint=f"known engines: {known}") from None


__all__ = ["REGISTRY", "EngineAdapter", "EngineSpec", "Launch", "PhasePattern", "get_engine"]

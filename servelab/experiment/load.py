"""Read an experiment file, and say exactly where it is wrong: `FILE:LINE: cells[1].parallel: <what>`.

YAML is composed into nodes first (each node keeps its line), the data is constructed from those nodes, and a
pydantic error's location (('cells', 1, 'parallel')) is looked up in a map from data paths to lines. A missing
field has no line of its own: the error points at the mapping that lacks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from servelab.errors import UserError
from servelab.experiment.model import Experiment

PathKey = tuple[Any, ...]


def load_experiment(path: Path) -> Experiment:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read the experiment file {path}: {exc.strerror or exc}") from None
    return parse_experiment(text, str(path))


def parse_experiment(text: str, where: str = "<experiment>") -> Experiment:
    data, lines = _compose(text, where)
    if not isinstance(data, dict):
        raise UserError(f"{where}:1: an experiment file is a mapping with `name` and `cells`",
                        hint="see examples/ and docs/compare.md")
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        loc = tuple(first["loc"])
        line = line_of(lines, loc)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(f"{where}:{line}: {dotted(loc) or 'the file'}: {_message(first)}{more}") from None


def dotted(loc: PathKey) -> str:
    """('cells', 1, 'parallel') -> cells[1].parallel"""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def line_of(lines: dict[PathKey, int], loc: PathKey) -> int:
    """The line of the longest prefix of `loc` that the file has (pydantic adds steps, e.g. a union branch)."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def _message(error: dict[str, Any]) -> str:
    msg = str(error["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if error["type"] == "extra_forbidden":
        msg = "unknown setting (misspelt?)"
    elif error["type"] == "missing":
        msg = "required but missing"
    return msg


def _compose(text: str, where: str) -> tuple[Any, dict[PathKey, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise UserError(f"{where}:1: the experiment file is empty")
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UserError(f"{where}:{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    lines: dict[PathKey, int] = {}
    _walk(node, (), lines)
    return data, lines


def _walk(node: yaml.Node, path: PathKey, lines: dict[PathKey, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _walk(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1  # the key's line reads best for a bad value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines)

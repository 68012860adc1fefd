"""Read an experiment file, and say exactly where it is wrong: `FILE:LINE: cells[1].parallel: <what>`.

YAML is composed into nodes first (each node keeps its line), the data is constructed from those nodes, and a
pydantic error's location (('cells', 1, 'parallel')) is looked up in a map from data paths to lines. A missing
field has no line of its own: the error points at the mapping that lacks it.

A file that is no experiment is one line too, never a crash or a hang (issue 11 item 17): at most
MAX_EXPERIMENT_BYTES are read, binary content is named with its line, nesting deeper than the composer can
follow is refused, and the node graph is checked before anything is built from it: an alias that contains itself
(`name: &a [*a]`) and aliases that expand to more than MAX_NODES values (a "billion laughs" file: nine aliases of
nine give 10^9) are refused with the line of the offending alias.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import re

import yaml
from pydantic import ValidationError

from servelab.errors import UserError
from servelab.experiment.model import Experiment

PathKey = tuple[Any, ...]
MAX_EXPERIMENT_BYTES = 1 << 20  # an experiment file is a page or two of YAML
MAX_NODES = 100_000  # values in the file with every alias expanded


def load_experiment(path: Path) -> Experiment:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_EXPERIMENT_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read the experiment file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_EXPERIMENT_BYTES:
        raise UserError(f"{path}: larger than {MAX_EXPERIMENT_BYTES // 2**20} MiB: not an experiment file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {exc.start}): not an experiment file") from None
    return parse_experiment(text, str(path), base_dir=path.parent)


def parse_experiment(text: str, where: str = "<experiment>", base_dir: Path | None = None) -> Experiment:
    """The experiment `text` declares. A relative file it names (a step's `trace` or `dataset`, a multi-turn
    dataset) is found from `base_dir`, the file's own directory, wherever servelab runs; None: the working
    directory."""
    data, lines = _compose(text, where)
    if not isinstance(data, dict):
        raise UserError(f"{where}:1: an experiment file is a mapping with `name` and `cells`",
                        hint="see examples/ and docs/compare.md")
    try:
        return Experiment.model_validate(data, context={"base_dir": base_dir})
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


class ExperimentLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true and false. YAML 1.1 also reads on/off and yes/no
    as booleans, which turns a cell's `on: ssh://gpu-box` into the key True; a setting that wants a boolean
    still takes "on" or "yes" (pydantic reads those words as true)."""


ExperimentLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ExperimentLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                       list("tTfF"))


def _compose(text: str, where: str) -> tuple[Any, dict[PathKey, int]]:
    loader = None
    try:
        loader = ExperimentLoader(text)  # reads the text through at once: a control character fails here
        node = loader.get_single_node()
        if node is None:
            raise UserError(f"{where}:1: the experiment file is empty")
        check_nodes(node, where)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UserError(f"{where}:{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:  # a control character: binary content, or a NUL in the text
        line = text.count("\n", 0, exc.position) + 1
        raise UserError(f"{where}:{line}: not valid YAML: {exc.reason} (U+{exc.character:04X}): not an "
                        f"experiment file") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to read (an experiment file is a few levels deep)") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[PathKey, int] = {}
    _walk(node, (), lines)
    return data, lines


def check_nodes(root: yaml.Node, where: str) -> None:
    """Refuse a node graph that cannot be an experiment before anything is built from it: an alias that contains
    itself, or aliases that expand to more than MAX_NODES values. Linear in the nodes of the file (each is sized
    once), whatever their aliases expand to."""
    size: dict[int, int] = {}  # node id -> values it expands to (capped just past MAX_NODES)
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(size[id(child)] for child in _children(node))
            size[key] = min(total, MAX_NODES + 1)
            if total > MAX_NODES:
                raise UserError(f"{where}:{node.start_mark.line + 1}: aliases here expand to more than "
                                f"{MAX_NODES:,} values (a 'billion laughs' file?): not an experiment")
            continue
        if key in size:
            continue
        if key in on_path:
            raise UserError(f"{where}:{node.start_mark.line + 1}: an alias that contains itself "
                            f"(like `name: &a [*a]`): an experiment cannot be recursive")
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise UserError(f"{where}:{child.start_mark.line + 1}: an alias that contains itself "
                                f"(like `name: &a [*a]`): an experiment cannot be recursive")
            if id(child) not in size:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


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

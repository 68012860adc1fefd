"""A JSONL file of prompts or chat messages, one request per line:

    {"prompt": "Tell me a story"}
    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
    {"prompt": "What is in this picture?", "images": ["photos/cat.png"]}

`max_tokens` (optional, a positive integer) is that line's output length. `images` (optional, a list of paths,
relative to the file's directory) are sent with the prompt (bench/workloads/images.py). Blank lines are skipped.
Anything else is an error naming the file and the line: a workload that silently drops lines changes what is
measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servelab.bench.workloads.dataset import MAX_TOKENS, DatasetItem, check_unicode, parse_json, read_text
from servelab.errors import UserError

KNOWN_KEYS = {"prompt", "messages", "max_tokens", "images"}


def load_jsonl(path: Path) -> list[DatasetItem]:
    items: list[DatasetItem] = []
    # Lines end at \n only: U+2028 and friends are legal inside a JSON string, and count as no line break.
    for lineno, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = parse_json(line, where)
        except ValueError as exc:
            raise UserError(f"{where}: invalid JSON: {exc}") from None
        item = parse_line(obj, where)
        if item.images is not None:  # relative to the dataset, wherever servelab is run from
            item.images = [str(path.parent / p) for p in item.images]
        items.append(item)
    return items


def parse_line(obj: Any, where: str) -> DatasetItem:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object with 'prompt' or 'messages', got {type(obj).__name__}")
    unknown = set(obj) - KNOWN_KEYS
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                        hint="each line has 'prompt' or 'messages', and optionally 'max_tokens'")
    if ("prompt" in obj) == ("messages" in obj):
        raise UserError(f"{where}: each line needs exactly one of 'prompt' and 'messages'")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise UserError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    if max_tokens is not None and max_tokens > MAX_TOKENS:
        digits = str(max_tokens)
        shown = digits if len(digits) <= 15 else f"{digits[:3]}… ({len(digits)} digits)"
        raise UserError(f"{where}: max_tokens {shown} is more than any server generates (at most {MAX_TOKENS:,})")
    check_unicode({k: obj[k] for k in ("prompt", "messages", "images") if k in obj}, where)  # a "\\ud800" escape
    images = obj.get("images")
    if images is not None and (not isinstance(images, list) or not images
                               or not all(isinstance(p, str) and p for p in images)):
        raise UserError(f"{where}: 'images' must be a non-empty list of image file paths")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise UserError(f"{where}: 'prompt' must be a non-empty string")
        return DatasetItem(obj["prompt"], where, max_tokens=max_tokens, images=images)
    return DatasetItem(check_messages(obj["messages"], where), where, max_tokens=max_tokens, images=images)


def check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise UserError(f"{where}: messages[{i}] needs a string 'role' and a 'content'")
        if not isinstance(m["content"], (str, list)):
            raise UserError(f"{where}: messages[{i}].content must be a string or a list of parts")
    return messages

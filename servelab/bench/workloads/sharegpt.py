"""ShareGPT-format JSON: `[{"conversations": [{"from": "human", "value": …}, {"from": "gpt", "value": …}]}, …]`.

The first human turn is the prompt; the gpt turn right after it is the reference answer, whose length in tokens
becomes the request's max_tokens when output lengths come from the dataset (as vLLM's and SGLang's ShareGPT
loaders do). "user"/"assistant" are accepted for "human"/"gpt". A conversation without a human turn is skipped
(public ShareGPT dumps have some) and counted in `skipped`; anything that is not this shape is an error naming
the file and the item's index and path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servelab.bench.workloads.dataset import DatasetItem, check_unicode, parse_json, read_text
from servelab.errors import UserError

HUMAN = {"human", "user"}
GPT = {"gpt", "assistant", "chatgpt", "bard", "bing"}


def load_sharegpt(path: Path) -> tuple[list[DatasetItem], int]:
    """(items, conversations skipped)."""
    try:
        data = parse_json(read_text(path), str(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UserError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: a ShareGPT file is a JSON list of conversations, got {type(data).__name__}")
    items: list[DatasetItem] = []
    skipped = 0
    for i, entry in enumerate(data):
        item = parse_entry(entry, f"{path}: item {i}")
        if item is None:
            skipped += 1
        else:
            items.append(item)
    return items, skipped


def parse_entry(entry: Any, where: str) -> DatasetItem | None:
    if not isinstance(entry, dict) or "conversations" not in entry:
        raise UserError(f"{where}: expected an object with 'conversations'")
    turns = entry["conversations"]
    if not isinstance(turns, list):
        raise UserError(f"{where} (conversations): expected a list of turns, got {type(turns).__name__}")
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise UserError(f"{where} (conversations[{t}]): expected an object with 'from' and 'value'")
        for key in ("from", "value"):
            if not isinstance(turn.get(key), str):
                raise UserError(f"{where} (conversations[{t}].{key}): expected a string, "
                                f"got {type(turn.get(key)).__name__}")
    first = next((t for t, turn in enumerate(turns) if turn["from"].lower() in HUMAN and turn["value"]), None)
    if first is None:
        return None
    reply = turns[first + 1]["value"] if first + 1 < len(turns) and turns[first + 1]["from"].lower() in GPT \
        else None
    check_unicode({"conversations": turns}, where)
    return DatasetItem(turns[first]["value"], f"{where} (conversations[{first}])", reference_output=reply)

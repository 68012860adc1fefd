"""What the benchmark sends. One module per source:

- stories.py        the default: distinct story prompts, fixed output length (prompt length not controlled)
- synthetic.py      exact input lengths after the chat template, fixed or distributed (lengths.py, filler.py)
- shared_prefix.py  N groups x M requests sharing a P-token prefix (prefix-cache workloads)
- sharegpt.py       ShareGPT-format JSON;  jsonl.py: one prompt or message list per line (both via dataset.py)
- prompt_tokens.py  counting a prompt's tokens after the chat template, by asking the server
- base.py           output-length control (max_tokens, ignore_eos, min_tokens) and the request body
"""

from __future__ import annotations

from pathlib import Path

from servelab.bench.workloads.base import CHAT, COMPLETIONS, OutputSpec, WorkloadSource
from servelab.bench.workloads.dataset import DatasetItem, DatasetWorkload
from servelab.bench.workloads.jsonl import load_jsonl
from servelab.bench.workloads.lengths import LengthSpec, parse_length
from servelab.bench.workloads.prompt_tokens import LlamaCppPromptCounter, PromptTokenCounter, counter_for
from servelab.bench.workloads.shared_prefix import SharedPrefixWorkload
from servelab.bench.workloads.sharegpt import load_sharegpt
from servelab.bench.workloads.stories import Workload
from servelab.bench.workloads.synthetic import SyntheticWorkload
from servelab.errors import UserError

DATASET_FORMATS = ("sharegpt", "jsonl")


def load_dataset(path: Path, fmt: str | None = None, **options) -> DatasetWorkload:
    """A DatasetWorkload from a file; the format is taken from the extension when not given
    (.jsonl -> jsonl, .json -> sharegpt)."""
    if fmt is None:
        fmt = {".jsonl": "jsonl", ".json": "sharegpt"}.get(path.suffix.lower())
        if fmt is None:
            raise UserError(f"cannot tell the format of {path} from its name",
                            hint="pass --dataset-format sharegpt or jsonl")
    if fmt == "jsonl":
        return DatasetWorkload(path=path, format=fmt, items=load_jsonl(path), **options)
    if fmt == "sharegpt":
        items, skipped = load_sharegpt(path)
        return DatasetWorkload(path=path, format=fmt, items=items, skipped=skipped, **options)
    raise UserError(f"unknown dataset format '{fmt}'", hint=f"use one of {', '.join(DATASET_FORMATS)}")


__all__ = ["CHAT", "COMPLETIONS", "DATASET_FORMATS", "DatasetItem", "DatasetWorkload", "LengthSpec",
           "LlamaCppPromptCounter", "OutputSpec", "PromptTokenCounter", "SharedPrefixWorkload", "SyntheticWorkload",
           "Workload", "WorkloadSource", "counter_for", "load_dataset", "load_jsonl", "load_sharegpt",
           "parse_length"]

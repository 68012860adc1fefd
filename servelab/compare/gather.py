"""From the command line's words to runs: run ids, run directories and `--baseline` figures.

`--baseline KEY=VALUE` (repeatable) makes one literal baseline, e.g. the story's vLLM figures
`--baseline single.decode_tok_s=82.5 --baseline peak.output_tok_s=1536`; `--baseline RUN` names a stored run or
a run directory as the baseline. Either way the baseline comes first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from servelab.compare.metrics import KEY_METRICS
from servelab.compare.run_data import RunData
from servelab.compare.sources import literal_run, resolve
from servelab.errors import UserError
from servelab.store.db import Store


@contextlib.contextmanager
def open_store_if_present(path: Path) -> Iterator[Store | None]:
    """Reading commands never create a store, nor write one (a read-only store can be read): without one, only
    run directories can be named."""
    if not Path(path).exists():
        yield None
        return
    store = Store.open(path, readonly=True)
    try:
        yield store
    finally:
        store.close()


LITERAL_NAME = "given figures"


def parse_literals(words: list[str]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for word in words:
        key, _, raw = word.partition("=")
        key = key.strip()
        if key not in KEY_METRICS:
            raise UserError(f"--baseline {word}: unknown figure '{key}'", hint=f"use one of {', '.join(KEY_METRICS)}")
        try:
            figures[key] = float(raw)
        except ValueError:
            raise UserError(f"--baseline {word}: '{raw}' is not a number") from None
        if figures[key] <= 0:
            raise UserError(f"--baseline {word}: a baseline figure must be positive")
    return figures


def gather_runs(refs: list[str], baselines: list[str], store: Store | None, store_path: Path | None = None
                ) -> list[RunData]:
    """Baseline first (literal figures or a named run), then `refs` in order."""
    literal_words = [b for b in baselines if "=" in b]
    run_words = [b for b in baselines if "=" not in b]
    if len(run_words) > 1 or (run_words and literal_words):
        raise UserError("give one baseline: a run, or figures as KEY=VALUE (repeatable)")
    runs: list[RunData] = []
    if literal_words:
        # Named for what they are: "comparison (baseline: given figures)", never "baseline: baseline".
        runs.append(literal_run(LITERAL_NAME, parse_literals(literal_words)))
    runs += [resolve(ref, store, store_path) for ref in run_words + refs]
    return runs

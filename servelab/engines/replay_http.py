"""The replay engine's HTTP side: the readiness and config endpoints answered the way the real engine answers them
during start-up (shared/research/engines.md §1.2, §2.3).

SGLang: the port is closed until the schedulers are ready; /health and /health_generate answer 503 until the
warm-up request has returned, then 200; /server_info (and the deprecated /get_server_info) return the ServerArgs
fields, `internal_states` with `memory_usage.graph` (0 when no CUDA graph was captured) and the version.
vLLM: the socket is bound early but not listening (connects are refused); once up, /health is 200 and /version
answers {"version": ...}. Both list the model at /v1/models.

Once up, each also answers the requests a benchmark sends, in its engine's formats, with a stand-in model:
- the tokenize endpoint the engine really has (bench/workloads/prompt_tokens.py names the sources): vLLM
  `POST /tokenize` (messages with add_generation_prompt / add_special_tokens, or a prompt), SGLang
  `POST /v1/tokenize` and `/tokenize` (exactly one of prompt or messages; `chat_tokenize=False` plays an older
  SGLang whose request requires a prompt and rejects messages);
- `/v1/chat/completions` and `/v1/completions`, streamed or not, with `usage.prompt_tokens` counted by the same
  stand-in tokenizer, so an exact-length workload can be checked against the replay's own usage.
The engines' cache and profiler controls, as their handlers answer (bench/cache_reset.py calls them):
- SGLang `/flush_cache` (GET or POST): 200 "Cache flushed. …" as text; `/start_profile` (an optional
  ProfileReqInput body: `output_dir`, default $SGLANG_TORCH_PROFILER_DIR or /tmp) 200 "Start profiling.", and
  `/stop_profile` 200 "Stop profiling. …", which writes `{output_dir}/{profile_id}-TP-{rank}.trace.json.gz` (a
  stand-in trace here); either out of turn is the scheduler's refusal raised as a RuntimeError: a plain 500.
- vLLM `POST /reset_prefix_cache`: 200 with an empty body, mounted only when VLLM_SERVER_DEV_MODE=1 (else 404
  {"detail": "Not Found"}); `POST /start_profile` / `/stop_profile`: 200, empty, mounted only when
  VLLM_TORCH_PROFILER_DIR is set (traces go there). Each reset and profile call is kept in `controls`.
The stand-in tokenizer is one token per whitespace-separated word; the chat template writes each message as
`<|im_start|> ROLE CONTENT <|im_end|>` (three tokens and the content's) and the generation prompt as
`<|im_start|> assistant` (two); a bare prompt gets a BOS where special tokens are added (vLLM's completions and
tokenize-prompt default, SGLang's likewise; vLLM's chat default adds none). The stand-in model answers
NATURAL_ANSWER_TOKENS words and stops, unless `ignore_eos` (exactly max_tokens) or `min_tokens` (at least that
many) say otherwise, as both engines honour them. Every generation request's body is kept in `requests`.

A model of a known reasoning family (engines/reasoning_families.py: `--model-path /shared/kimi-k2.5-int4`) thinks
first, in chat: THINKING_WORDS of thinking, then `</think>`, then its answer. The story's question ("What is 2+2?
Reply in one word.") gets the story's thinking, whose first 32 tokens are byte for byte the content the story's
SGLang sent back. Run with `--reasoning-parser`, the engine separates the two as it does: SGLang in
`reasoning_content` (with `usage.reasoning_tokens` at the top level), vLLM in `reasoning` (with
`usage.completion_tokens_details.reasoning_tokens`); `</think>` is counted but not shown. Without one, everything,
`</think>` included, is `content`, and the reasoning field is null (SGLang's `reasoning_content`, vLLM's
`reasoning`). A request can turn thinking on or off with `chat_template_kwargs` (`thinking`/`enable_thinking`).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from servelab.engines.reasoning_families import ReasoningFamily, family_of

BOS = "<s>"
VOCAB = 49152
CONTEXT = 32768
NATURAL_ANSWER_TOKENS = 12
DEFAULT_MAX_TOKENS = 16
ANSWER_WORDS = ("the", "replay", "answers", "with", "plain", "words", "one", "token", "each", "until", "it",
                "stops")
THINKING_WORDS = ("The", "user", "asks", "something", "so", "I", "will", "answer", "in", "plain", "words.")
THINK_END = "</think>"
STORY_PROMPT = "What is 2+2? Reply in one word."
# The story's reply from SGLang serving Kimi-K2.5 without a reasoning parser was these 32 tokens of content
# (finish_reason length at max_tokens 32); the thinking goes on after them, then the answer.
STORY_THINKING = (" The", " user", " is", " asking", " for", " the", " answer", " to", ' "', "2", "+", "2", '"',
                  " and", " wants", " me", " to", " reply", " in", " one", " word", ".", "\n", "\n", " 2", "+", "2",
                  " =", " 4", "\n\n", " The", " word",
                  " is", ' "', "four", '"', ".", "\n\n", " So", " the", " answer", " is", ":", " Four")
STORY_ANSWER = ("Four",)


def message_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def render_chat(messages: list[Any], add_generation_prompt: bool = True) -> str:
    parts = [f"<|im_start|> {m.get('role', 'user')} {message_text(m.get('content'))} <|im_end|>"
             for m in messages if isinstance(m, dict)]
    if add_generation_prompt:
        parts.append("<|im_start|> assistant")
    return " ".join(parts)


def fake_tokens(text: str, *, bos: bool = False) -> list[int]:
    """The stand-in tokenizer: one id per whitespace-separated word, stable across runs."""
    words = ([BOS] if bos else []) + text.split()
    return [zlib.crc32(w.encode()) % VOCAB for w in words]


def _sse(events: list[Any]) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events)


@dataclass
class ReplayState:
    engine: str  # "sglang" or "vllm"
    version: str
    model: str
    server_args: dict[str, Any]
    health: int = 503  # what /health answers once the port listens
    graphs_captured: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    chat_tokenize: bool = True  # SGLang: whether /v1/tokenize takes messages (recent) or only a prompt (older)
    requests: list[dict[str, Any]] = field(default_factory=list)  # generation requests seen: path and body
    # hang-in-decode: called when a stream stops after its first events; it never returns (replay.py)
    hang_stream: Any = None
    # vLLM's development endpoints and profiler are mounted by environment, read once at start-up as vLLM reads it
    dev_mode: bool = field(default_factory=lambda: os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"))
    profiler_dir: str | None = field(default_factory=lambda: os.environ.get("VLLM_TORCH_PROFILER_DIR") or None)
    controls: list[str] = field(default_factory=list)  # cache resets and profiler calls seen, e.g. "POST /flush_cache"
    profiling: dict[str, Any] | None = None  # the profile in progress: its output_dir and profile_id

    def control(self, method: str, path: str, raw: bytes) -> tuple[int, bytes, str | None] | None:
        """The engine's answer to a cache or profiler control (status, body, content type; None: the real handler
        sets none), or None when `path` is not one."""
        path = path.split("?", 1)[0]
        text = "text/plain; charset=utf-8"
        if self.engine == "sglang" and path in ("/flush_cache", "/start_profile", "/stop_profile"):
            self.controls.append(f"{method} {path}")
            if path == "/flush_cache":  # http_server.py flush_cache: Response(content=..., no media type)
                return 200, (b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
                             b"or waiting requests, the operation will not be performed.)\n"), None
            if path == "/start_profile":
                try:
                    obj = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    obj = None
                if not isinstance(obj, dict):
                    return 400, json.dumps({"object": "error", "message": "the body is not a ProfileReqInput",
                                            "type": "Bad Request", "param": None, "code": 400}).encode(), \
                        "application/json"
                if self.profiling is not None:  # "Profiling is already in progress. Call /stop_profile first."
                    return 500, b"Internal Server Error", text
                out = obj.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
                self.profiling = {"output_dir": str(out), "profile_id": f"{time.time()}"}
                return 200, b"Start profiling.\n", None
            if self.profiling is None:  # "Profiling is not in progress. Call /start_profile first."
                return 500, b"Internal Server Error", text
            done, self.profiling = self.profiling, None
            self._write_trace(done["output_dir"], f"{done['profile_id']}-TP-0.trace.json.gz")
            return 200, b"Stop profiling. This will take some time.\n", None
        if self.engine == "vllm" and path == "/reset_prefix_cache" and method == "POST" and self.dev_mode:
            self.controls.append(f"{method} {path}")
            return 200, b"", None
        if self.engine == "vllm" and path in ("/start_profile", "/stop_profile") and method == "POST" \
                and self.profiler_dir:
            self.controls.append(f"{method} {path}")
            if path == "/stop_profile" and self.profiling is not None:
                self._write_trace(self.profiler_dir, f"replay-rank-0.{int(time.time() * 1000)}.pt.trace.json.gz")
            self.profiling = {"output_dir": self.profiler_dir} if path == "/start_profile" else None
            return 200, b"", None
        return None

    @staticmethod
    def _write_trace(directory: str, name: str) -> None:
        """A stand-in Chrome trace where the engine would write its own (the directory made as SGLang makes it)."""
        try:
            os.makedirs(directory, exist_ok=True)
            with gzip.open(os.path.join(directory, name), "wt") as fh:
                json.dump({"traceEvents": []}, fh)
        except OSError:
            pass  # the engine logs a failed export; the replay has nothing to add

    def routes(self, path: str) -> tuple[int, Any]:
        path = path.split("?", 1)[0]
        models = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": self.engine,
                                              "root": self.model}]}
        if self.engine == "sglang":
            if path in ("/health", "/health_generate"):
                return self.health, {} if self.health == 200 else {"error": "server is starting"}
            if path in ("/server_info", "/get_server_info"):
                return 200, self.sglang_server_info()
            if path in ("/model_info", "/get_model_info"):
                return 200, {"model_path": self.model, "tokenizer_path": self.model, "is_generation": True}
            if path == "/ping":
                return 200, {}
            if path == "/v1/models":
                return 200, models
        else:
            if path in ("/health", "/ping"):
                return self.health, {}
            if path == "/version":
                return 200, {"version": self.version}
            if path == "/v1/models":
                return 200, models
        return 404, {"detail": "Not Found"}

    # ---- POST: tokenize and generate ----
    def post(self, path: str, body: Any) -> tuple[int, bytes, str]:
        """(status, body bytes, content type) for a POST."""
        path = path.split("?", 1)[0]
        if not isinstance(body, dict):
            return self._json(*self.error(400, "the request body must be a JSON object"))
        if self.engine == "vllm" and path == "/tokenize" or self.engine == "sglang" and path in (
                "/v1/tokenize", "/tokenize"):
            return self._json(*(self.vllm_tokenize(body) if self.engine == "vllm" else self.sglang_tokenize(body)))
        if path in ("/v1/chat/completions", "/v1/completions"):
            return self.generate(path, body)
        return self._json(404, {"detail": "Not Found"})

    def _json(self, status: int, body: Any) -> tuple[int, bytes, str]:
        return status, json.dumps(body).encode(), "application/json"

    def error(self, status: int, message: str, kind: str = "BadRequestError") -> tuple[int, dict[str, Any]]:
        if self.engine == "sglang":  # protocol.py ErrorResponse
            return status, {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return status, {"error": {"message": message, "type": kind, "param": None, "code": status}}

    def vllm_tokenize(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """TokenizeChatRequest | TokenizeCompletionRequest -> TokenizeResponse."""
        if isinstance(body.get("messages"), list):
            generation = body.get("add_generation_prompt", True)
            if body.get("continue_final_message") and generation:
                return self.error(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                                       "True.")
            tokens = fake_tokens(render_chat(body["messages"], generation),
                                 bos=bool(body.get("add_special_tokens", False)))
        elif isinstance(body.get("prompt"), str):
            tokens = fake_tokens(body["prompt"], bos=bool(body.get("add_special_tokens", True)))
        else:
            return self.error(400, "1 validation error: a tokenize request needs `prompt` or `messages`")
        return 200, {"count": len(tokens), "max_model_len": CONTEXT, "tokens": tokens, "token_strs": None}

    def sglang_tokenize(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """TokenizeRequest -> TokenizeResponse; an older SGLang requires `prompt` and knows no `messages`."""
        prompt, messages = body.get("prompt"), body.get("messages")
        if not self.chat_tokenize and prompt is None:
            return self.error(400, "1 validation error for TokenizeRequest\nprompt\n  Field required")
        if self.chat_tokenize and (prompt is None) == (messages is None):
            return self.error(400, "Value error, Exactly one of 'prompt' or 'messages' must be provided.")
        if prompt is None:
            tokens = fake_tokens(render_chat(messages if isinstance(messages, list) else []))
            return 200, {"tokens": tokens, "count": len(tokens), "max_model_len": CONTEXT}
        special = bool(body.get("add_special_tokens", True))
        if isinstance(prompt, list):
            lists = [fake_tokens(str(p), bos=special) for p in prompt]
            return 200, {"tokens": lists, "count": [len(t) for t in lists], "max_model_len": CONTEXT}
        tokens = fake_tokens(str(prompt), bos=special)
        return 200, {"tokens": tokens, "count": len(tokens), "max_model_len": CONTEXT}

    def prompt_tokens(self, path: str, body: dict[str, Any]) -> int | None:
        """What the engine would count for this request's prompt (None: no usable prompt)."""
        if path.endswith("/chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return None
            special = self.engine == "vllm" and bool(body.get("add_special_tokens", False))
            return len(fake_tokens(render_chat(messages, bool(body.get("add_generation_prompt", True))),
                                   bos=special))
        prompt = body.get("prompt")
        return len(fake_tokens(prompt, bos=True)) if isinstance(prompt, str) else None

    # ---- the stand-in model ----
    @property
    def family(self) -> ReasoningFamily | None:
        return family_of(self.model)

    @property
    def reasoning_parser(self) -> str | None:
        parser = self.server_args.get("reasoning_parser")
        return parser if isinstance(parser, str) and parser else None

    @property
    def reasoning_field(self) -> str:
        return "reasoning_content" if self.engine == "sglang" else "reasoning"

    def thinking(self, chat: bool, body: dict[str, Any]) -> tuple[str, ...]:
        """The thinking the stand-in model writes before its answer: none unless it is a reasoning family (and
        the request did not turn thinking off), the story's for the story's question."""
        family = self.family
        if not chat or family is None:
            return ()
        kwargs = body.get("chat_template_kwargs") if isinstance(body.get("chat_template_kwargs"), dict) else {}
        asked = [kwargs[k] for k in ("thinking", "enable_thinking") if k in kwargs]
        if not (bool(asked[0]) if asked else family.thinks_by_default):
            return ()
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        last = message_text(messages[-1].get("content")) if messages and isinstance(messages[-1], dict) else ""
        if last.strip() == STORY_PROMPT:
            return STORY_THINKING
        return tuple((" " if i else "") + w for i, w in enumerate(THINKING_WORDS))

    def plan(self, chat: bool, body: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
        """(the generated pieces as (kind, text), kind "reasoning", "end" (</think>) or "answer"; finish_reason).
        One piece is one token."""
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
        think = self.thinking(chat, body)
        head = [("reasoning", t) for t in think] + ([("end", THINK_END)] if think else [])
        story = think is STORY_THINKING
        natural = max(len(head) + (len(STORY_ANSWER) if story else NATURAL_ANSWER_TOKENS),
                      int(body.get("min_tokens") or 0))
        n = limit if body.get("ignore_eos") else min(limit, natural)
        finish = "length" if body.get("ignore_eos") or natural > limit else "stop"

        def answer(i: int) -> str:
            if story and i < len(STORY_ANSWER):
                return STORY_ANSWER[i]
            return (" " if i else "") + ANSWER_WORDS[i % len(ANSWER_WORDS)]

        pieces = head[:n] + [("answer", answer(i)) for i in range(max(0, n - len(head)))]
        return pieces, finish

    def generate(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
        self.requests.append({"path": path, "body": body})
        if self.engine == "vllm" and body.get("model") not in (None, self.model):
            return self._json(*self.error(404, f"The model `{body.get('model')}` does not exist.",
                                          "NotFoundError"))
        prompt = self.prompt_tokens(path, body)
        if prompt is None:
            return self._json(*self.error(400, "the request needs messages or a prompt string"))
        chat = path.endswith("/chat/completions")
        planned, finish = self.plan(chat, body)
        n = len(planned)
        # With a reasoning parser the engine moves the thinking to its own field and shows no </think>.
        separate = self.reasoning_parser is not None
        field_name = self.reasoning_field
        thought = sum(1 for kind, _ in planned if kind == "reasoning")
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-replay-{len(self.requests)}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def usage(done: int) -> dict[str, Any]:
            counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": done,
                                      "total_tokens": prompt + done}
            if separate and thought:
                reasoning_done = sum(1 for k, _ in planned[:done] if k == "reasoning")
                if self.engine == "sglang":
                    counts["reasoning_tokens"] = reasoning_done  # top level (sglang protocol.py UsageInfo)
                else:
                    counts["completion_tokens_details"] = {"reasoning_tokens": reasoning_done}
            return counts

        def delta(piece_kind: str, text: str) -> dict[str, Any] | None:
            """A piece's delta; None for what the parser swallows (</think>)."""
            if separate and piece_kind == "end":
                return None
            return {field_name: text} if separate and piece_kind == "reasoning" else {"content": text}

        if not body.get("stream"):
            if chat:
                shown = [(k, t) for k, t in planned if not (separate and k == "end")]
                content = "".join(t for k, t in shown if not (separate and k == "reasoning"))
                reasoning = "".join(t for k, t in shown if separate and k == "reasoning")
                message = {"role": "assistant", "content": content if content or not separate else None,
                           field_name: reasoning or None}
                choice = {"index": 0, "message": message, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": "".join(t for _, t in planned), "finish_reason": finish}
            return self._json(200, {"id": rid, "object": kind, "created": created, "model": self.model,
                                    "choices": [choice], "usage": usage(n)})
        options = body.get("stream_options") or {}
        every = bool(options.get("continuous_usage_stats"))

        def chunk(payload: dict[str, Any] | str | None, done: int, finish_reason: str | None = None
                  ) -> dict[str, Any]:
            choices = [] if payload is None else [{"index": 0, "finish_reason": finish_reason, **(
                {"delta": payload} if chat else {"text": payload})}]
            c = {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created, "model": self.model,
                 "choices": choices}
            return c | {"usage": usage(done)} if every else c

        events: list[Any] = [chunk({"role": "assistant", "content": ""}, 0)] if chat else []
        for i, (piece_kind, text) in enumerate(planned):
            payload = delta(piece_kind, text) if chat else text
            if payload is not None:
                events.append(chunk(payload, i + 1))
        events.append(chunk({} if chat else "", n, finish))
        if options.get("include_usage"):
            events.append({"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                           "model": self.model, "choices": [], "usage": usage(n)})
        events.append("[DONE]")
        return 200, _sse(events), "text/event-stream"

    def sglang_server_info(self) -> dict[str, Any]:
        graph_gb = 3.21 if self.graphs_captured else 0.0
        state = {**self.server_args, "last_gen_throughput": 0.0, "effective_max_running_requests_per_dp": 2048,
                 "memory_usage": {"weight": 68.41, "kvcache": 52.1, "token_capacity": 812345, "graph": graph_gb}}
        return {**self.server_args, "max_total_num_tokens": 812345, "max_req_input_len": 163834,
                "internal_states": [state], "version": self.version}


def _handler(state: ReplayState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            control = state.control("GET", self.path, b"")
            if control is not None:
                self.answer(*control)
                return
            status, body = state.routes(self.path)
            self.answer(status, json.dumps(body).encode(), "application/json")

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            control = state.control("POST", self.path, raw)
            if control is not None:
                self.answer(*control)
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self.answer(*state._json(*state.error(400, "the request body is not JSON")))
                return
            status, data, content_type = state.post(self.path, body)
            if state.hang_stream is not None and content_type == "text/event-stream":
                # The first two events (the role, one token), then nothing: the engine hung mid-decode while the
                # server stays up and /health still answers.
                cut = data.find(b"\n\n", data.find(b"\n\n") + 2) + 2
                self.answer(status, data, content_type, upto=cut)
                state.hang_stream()
                return
            self.answer(status, data, content_type)

        def answer(self, status: int, data: bytes, content_type: str | None, upto: int | None = None) -> None:
            self.send_response(status)
            if content_type is not None:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data if upto is None else data[:upto])
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the replayed log is the engine's log; our probes would only add noise to it

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that drops a kept-alive connection is not news; the replayed log must stay the engine's


class ReplayHTTP:
    """Bind, listen and serve in separate steps, as the real engines do them at different moments."""

    def __init__(self, host: str, port: int, state: ReplayState):
        self.server = _Server((host, port), _handler(state), bind_and_activate=False)
        self.server.daemon_threads = True
        self._bound = self._listening = False

    def bind(self) -> None:
        if not self._bound:
            self.server.server_bind()
            self._bound = True

    def listen(self) -> None:
        if self._listening:
            return
        self.bind()
        self.server.server_activate()
        self._listening = True
        threading.Thread(target=self.server.serve_forever, name="replay-http", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        if self._listening:
            self.server.shutdown()
        self.server.server_close()

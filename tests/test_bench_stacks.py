"""bench: a stream that hits its idle deadline has the engine's stacks read, once per level, and their summary goes
with the level's errors (bench/stall_stacks.py).

The "engine" is a real local process: a small streaming server (written out below and run with this Python) that
sends one token and then waits for ever inside `generate_next_token`, as an engine stuck mid-decode would. bench
finds it by the port it listens on (host/environment.py) and reads its stacks with the real py-spy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import servelab
from servelab.bench.stall_stacks import WARNING
from servelab.engines import EngineSpec
from servelab.lifecycle.launch import start_engine

pytestmark = pytest.mark.timeout(90)

SERVER = r'''
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NEVER = threading.Event()
CHUNK = {"id": "s", "object": "chat.completion.chunk", "model": "m",
         "choices": [{"index": 0, "delta": {"content": " one"}, "finish_reason": None}]}


def generate_next_token():
    NEVER.wait()  # the next token never comes: the stream goes idle


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: " + json.dumps(CHUNK).encode() + b"\n\n")
        self.wfile.flush()
        generate_next_token()


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print("LISTENING", server.server_address[1], flush=True)
server.serve_forever()
'''


@pytest.fixture
def stalling_server(tmp_path):
    script = tmp_path / "stalling_server.py"
    script.write_text(SERVER, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("LISTENING"), line
        yield proc, f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(10)


def test_an_idle_deadline_has_the_engines_stacks_read_once_and_named_with_the_level(stalling_server, tmp_path):
    proc, url = stalling_server
    started = time.monotonic()
    run = servelab.bench(url, requests=3, max_tokens=8, warmup=0, timeout_idle=1.0, tokenizer="none",
                         out=tmp_path / "runs")
    level = run.result.levels[0]
    assert [e.kind for e in level.top_errors] == ["timeout_idle"] and level.top_errors[0].count >= 2
    said = [w for w in level.warnings if w.startswith(WARNING)]
    assert len(said) == 1, level.warnings  # one capture for the level, however many streams went idle
    # The stacks were the server's: its handler threads waiting in generate_next_token, nothing moving.
    assert "pid " in said[0] or "process" in said[0], said[0]
    assert "stacks could not be read" not in said[0] and "not installed" not in said[0], said[0]
    # told by the handler thread waiting in the engine's code, not by the main thread idle in serve_forever
    assert "pid " + str(proc.pid) + " handling a request, waiting in generate_next_token (" in said[0], said[0]
    assert "idle (a ready server" not in said[0] and said[0].endswith("stuck (waiting, not idle)"), said[0]
    # Read off the event loop: the level did not wait for every sample before its streams ended (two streams of
    # one second each, one capture of about a second beside them).
    assert time.monotonic() - started < 30
    # `servelab show` prints it with the level's errors.
    shown = subprocess.run([sys.executable, "-m", "servelab.cli", "show", str(run.run_dir)], capture_output=True,
                           text=True, timeout=60)
    assert WARNING in shown.stdout and "timeout_idle" in shown.stdout, shown.stdout[-2000:] + shown.stderr


def test_a_server_that_answers_has_no_stacks_read(tmp_path):
    pytest.importorskip("aiohttp")
    slot = subprocess.Popen([sys.executable, "tests/slot_server.py", "--slots", "2", "--ttft-ms", "5",
                             "--itl-ms", "5", "--tokens", "4"], stdout=subprocess.PIPE, text=True)
    try:
        line = slot.stdout.readline()
        port = int(line.split()[1])
        run = servelab.bench(f"http://127.0.0.1:{port}", requests=3, max_tokens=4, warmup=0, timeout_idle=1.0,
                             tokenizer="none")
        assert not [w for w in run.result.levels[0].warnings if w.startswith(WARNING)]
    finally:
        slot.kill()
        slot.wait(10)


def test_the_replayed_sglang_hung_mid_decode_is_named_a_likely_deadlock_in_the_levels_warnings(tmp_path):
    """The replayed SGLang tp=8 (hang-in-decode): every stream stops after its first token while rank 3's batch
    waits in all_reduce and the other ranks' in broadcast; /health still answers. bench finds the engine by its
    port, and the one capture of the level says what a user could not tell from the client."""
    spec = EngineSpec(engine="replay-sglang", model="smollm2", options={"speed": "200", "variant": "hang-in-decode"})
    with start_engine(spec, tmp_path, ready_timeout_s=60, stacks=False) as running:
        run = servelab.bench(running.url, requests=3, max_tokens=8, warmup=0, timeout_idle=1.0, tokenizer="none")
    level = run.result.levels[0]
    assert [e.kind for e in level.top_errors] == ["timeout_idle"]
    said = [w for w in level.warnings if w.startswith(WARNING)]
    assert len(said) == 1, level.warnings
    assert "ranks 0-2,4-7 in broadcast" in said[0] and "rank 3 in all_reduce" in said[0], said[0]
    assert said[0].endswith("a likely deadlock"), said[0]
    # the same line with the errors it explains
    assert WARNING + level.top_errors[0].stacks == said[0]

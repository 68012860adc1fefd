"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/entrypoints/http_server.py: the main process (tokenizer manager, HTTP server)."""

from sglang.srt.entrypoints.engine import _launch_subprocesses


def launch_server(state):
    _launch_subprocesses(state)
    state.hang()  # uvicorn.run(app): the replay's HTTP server answers on its own thread

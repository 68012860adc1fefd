"""Stand-in (see vllm/__init__.py): vLLM 0.33's vllm/entrypoints/openai/api_server.py: the API server process."""


def build_async_engine_client(state):
    state.wait_while("init", "load", "kv", "graph")  # the engine core's handshake: ready once it is up


def run_server(state):
    build_async_engine_client(state)
    state.hang()  # serve_http(app): the replay's HTTP server answers on its own thread

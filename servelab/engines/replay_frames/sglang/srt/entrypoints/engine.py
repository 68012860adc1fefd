"""Stand-in (see sglang/__init__.py): SGLang 0.5.10's srt/entrypoints/engine.py: the main process starts the schedulers and waits for them to be ready."""


def _launch_subprocesses(state):
    # scheduler_pipe_readers[i].recv(): each scheduler reports when its start-up is done
    state.wait_while("init", "load", "kv", "graph")

"""Stand-in for vllm, for the replay engine's stacks only (servelab/engines/replay_ranks.py): modules and
functions named and laid out as in vllm's own source, so py-spy shows what a real process of it would be doing.
None of vllm's code is here. Importable only inside the replay process, which puts replay_frames/ on sys.path."""

if __name__ != "vllm":
    raise ImportError("servelab/engines/replay_frames holds stand-ins for the replay engine's stacks, not a package")

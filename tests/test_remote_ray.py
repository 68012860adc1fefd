"""`--on ray:GPU=8` on a real local Ray cluster (one node, eight logical GPUs, none real, and a custom resource),
started by the test on 127.0.0.1: the far side is the same remote job as over SSH, run by an actor that holds the
resources; its run comes back checked; a placement no node can hold fails at once in one line; the actor killed
mid-job stops the engine there within the grace, as a lost SSH controller does.

Slow tier: Ray takes ~15 s to start on two cores; skipped cleanly where Ray is not installed
(`pip install 'servelab[ray]'`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

# Before Ray is imported, as tests/test_workers_ray.py does: the node named by the loopback address, no usage
# statistics sent anywhere; assigned, not defaulted, so that no value from the environment sends traffic off
# 127.0.0.1. The servelab processes the tests start inherit them.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

ray = pytest.importorskip("ray")

from remote_support import READY, RUNNING, SERVELAB, Run, health, no_traceback, run  # noqa: E402

from servelab.calibration import Script, start_calibration_server  # noqa: E402
from servelab.errors import UserError  # noqa: E402
from servelab.records import RunSummary  # noqa: E402
from servelab.remote.agent import worker_alive  # noqa: E402
from servelab.remote.placement import RayPlacement  # noqa: E402
from servelab.remote.ray_link import NAMESPACE, PLACE_WAIT_VAR, RayLink  # noqa: E402

pytestmark = pytest.mark.slow

PLACED = re.compile(r"remote: placed on Ray node (\S+) \(.*\), actor (servelab-link-\w+) in namespace servelab, "
                    r"holding (\S+)(?: \(CUDA_VISIBLE_DEVICES=(\S+?)(?:, no GPU held)?\))?$")
GRACE_S = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, and the environment a servelab joining it is given. The far side's processes inherit the
    cluster's environment, not the controller's: jobs that name no --remote-dir (an experiment cell's) go under
    the SERVELAB_REMOTE_ROOT it was started with, not this user's ~/.servelab/remote."""
    root = tmp_path_factory.mktemp("ray-far")
    before = os.environ.get("SERVELAB_REMOTE_ROOT")
    os.environ["SERVELAB_REMOTE_ROOT"] = str(root)
    try:
        ray.init(num_cpus=3, num_gpus=8, resources={"accelerator_type_H100": 1}, include_dashboard=False,
                 logging_level="ERROR")
    finally:
        if before is None:
            del os.environ["SERVELAB_REMOTE_ROOT"]
        else:
            os.environ["SERVELAB_REMOTE_ROOT"] = before
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}, ray.nodes()
        yield SimpleNamespace(env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}, far_root=root)
    finally:
        ray.shutdown()


def up_ready(cluster, tmp_path) -> tuple[Run, str, re.Match, Path]:
    """`up` of the replay engine on ray:GPU=8, ready: (it, the engine's URL, the placement note, the job dir)."""
    up = Run(["up", "replay-sglang", "--option", "speed=300", "--on", "ray:GPU=8", "--remote-dir",
              str(tmp_path / "far"), "--disconnect-grace", str(GRACE_S)], cluster.env, tmp_path)
    url = up.wait_for(READY, timeout=120).group(1)
    up.wait_for("press Ctrl-C to stop")
    assert health(url) == 200
    placed = up.wait_for(PLACED, stream="err", timeout=5)
    job_dir, _worker = up.job()
    assert worker_alive(job_dir)
    return up, url, placed, job_dir


def wait_stopped(job_dir: Path, since: float) -> None:
    while worker_alive(job_dir) and time.monotonic() - since < GRACE_S + 15:
        time.sleep(0.1)
    assert not worker_alive(job_dir), "the job there outlived its controller's grace"


def gpus_free_again(timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("GPU", 0) == 8:
            return True
        time.sleep(0.2)
    return False


def test_bench_on_a_ray_placement_runs_there_and_its_run_comes_back_checked(cluster, tmp_path):
    local, far = tmp_path / "local", tmp_path / "far"
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=8)) as cal:
        code, bench = run(["bench", cal.url, "--mode", "concurrency", "--concurrency", "2", "--requests", "6",
                           "--warmup", "0", "--max-tokens", "8", "--tokenizer", "none", "--out", str(local),
                           "--on", "ray:GPU=8", "--remote-dir", str(far)], cluster.env, tmp_path, timeout=180)
    assert code == 0, bench.stdout + bench.stderr
    (placed,) = [m for line in bench.err if (m := PLACED.search(line))]
    assert placed.group(1) == "127.0.0.1" and placed.group(3) == "ray:GPU=8"
    assert sorted(placed.group(4).split(",")) == [str(i) for i in range(8)]  # the eight Ray gave the actor
    job_dir = next(m for line in bench.err if (m := RUNNING.search(line)))
    assert job_dir.group(1) == "ray:GPU=8"
    job = tmp_path / "far" / os.path.basename(job_dir.group(2))
    assert job.is_dir() and json.loads((job / "job.json").read_text())["argv"][0] == "bench"
    assert (job / "events.jsonl").read_text().splitlines()[-1] == '{"k":"exit","code":0}'
    # Copied back whole, and kept in this side's store, marked with where it ran.
    copied = [line for line in bench.err if line.startswith("remote: copied ")]
    assert len(copied) == 1, bench.stderr
    run_id = copied[0].split()[2]
    (there,) = far.glob(f"*/results/{run_id}")
    for name in ("summary.json", "records.jsonl.gz"):
        assert (local / run_id / name).read_bytes() == (there / name).read_bytes()
    shown = subprocess.run([*SERVELAB, "show", run_id, "--out", str(local), "--json"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["provenance"]["ran_on"] == "ray:GPU=8"
    ((sent, ok),) = [(level["requests"], level["ok"]) for level in doc["sweep"]["levels"]]
    assert sent == ok == 6
    no_traceback(bench.stderr)
    # The actor is gone with the command, and the GPUs it held are Ray's again.
    with pytest.raises(ValueError):
        ray.get_actor(placed.group(2), namespace=NAMESPACE)
    assert gpus_free_again()


def test_a_placement_no_node_can_hold_fails_at_once_in_one_line(cluster, tmp_path):
    started = time.monotonic()
    code, bench = run(["bench", "http://127.0.0.1:9", "--on", "ray:GPU=9", "--out", str(tmp_path)],
                      cluster.env, tmp_path, timeout=120)
    assert code == 2, bench.stdout + bench.stderr
    # one line, Ray's own logging kept out of it
    (error,) = [line for line in bench.err if line.strip()] or [""]
    assert error.startswith("error: no node of the Ray cluster has GPU=9 (1 node; the most any has: GPU=8) ("), \
        bench.stderr
    no_traceback(bench.stderr)
    assert time.monotonic() - started < 60  # not Ray's pending-for-ever
    # A custom resource no node was started with, and one that some node has alongside one it has not.
    with pytest.raises(UserError, match=r"has accelerator_type_A100=1 \(1 node; the most any has: "
                                        r"accelerator_type_A100=0\)"):
        with RayLink.open(RayPlacement.parse("ray:accelerator_type_A100=1")):
            pass
    with pytest.raises(UserError, match=r"has CPU=64 \(1 node; the most any has: CPU=3\) "):
        with RayLink.open(RayPlacement.parse("ray:accelerator_type_H100=1,CPU=64")):
            pass
    assert gpus_free_again()


def test_a_placement_whose_resources_are_busy_is_waited_for_a_bounded_time(cluster, monkeypatch):
    monkeypatch.setenv(PLACE_WAIT_VAR, "2")
    with RayLink.open(RayPlacement.parse("ray:GPU=8")) as holding:
        assert holding.check()
        started = time.monotonic()
        with pytest.raises(UserError, match=r"had ray:GPU=1 free within 2 s: the nodes that have them are busy"):
            with RayLink.open(RayPlacement.parse("ray:GPU=1")):
                pass
        assert time.monotonic() - started < 20
    assert gpus_free_again()


def test_the_actor_killed_mid_job_stops_the_engine_there_within_the_grace(cluster, tmp_path):
    up, url, placed, job_dir = up_ready(cluster, tmp_path)
    try:
        ray.kill(ray.get_actor(placed.group(2), namespace=NAMESPACE))
        killed_at = time.monotonic()
        # The controller says so in one line, at once (no new actor: the GPUs are Ray's again) ...
        code = up.finish(60)
        assert code == 2, up.stdout + up.stderr
        errors = [line for line in up.err if line.startswith("error:")]
        assert len(errors) == 1 and f"the Ray actor {placed.group(2)} that held ray:GPU=8 on node 127.0.0.1 is " \
                                    f"gone" in errors[0], up.stderr
        assert f"stops the engine once it has heard from no controller for {GRACE_S} s" in errors[0]
        # ... and the job there, hearing no controller through the actor any more, stops the engine.
        wait_stopped(job_dir, killed_at)
        assert health(url) is None
    finally:
        up.kill()
    events = (job_dir / "events.jsonl").read_text()
    assert "the controller has been gone for" in events and "stopping, as --on-disconnect stop says" in events
    assert events.splitlines()[-1] == '{"k":"exit","code":0}'
    no_traceback(up.stderr)
    assert gpus_free_again()


def test_a_killed_controller_takes_its_actor_with_it_and_the_engine_stops_within_the_grace(cluster, tmp_path):
    up, url, placed, job_dir = up_ready(cluster, tmp_path)
    up.kill()  # SIGKILL: no goodbye; Ray ends the actors of a driver that died
    killed_at = time.monotonic()
    wait_stopped(job_dir, killed_at)
    assert health(url) is None
    events = (job_dir / "events.jsonl").read_text()
    assert "the controller has been gone for" in events
    assert events.splitlines()[-1] == '{"k":"exit","code":0}'
    assert gpus_free_again(30), "the actor outlived its controller, holding the GPUs"


def test_ctrl_c_here_stops_the_engine_there_through_the_actor(cluster, tmp_path):
    up, url, _placed, job_dir = up_ready(cluster, tmp_path)
    try:
        up.interrupt()
        code = up.finish(60)
    finally:
        up.kill()
    assert code == 0, up.stdout + up.stderr
    assert "stopping…" in up.out
    assert not worker_alive(job_dir) and health(url) is None
    assert (job_dir / "events.jsonl").read_text().splitlines()[-1] == '{"k":"exit","code":0}'
    no_traceback(up.stderr)
    assert gpus_free_again()


EXPERIMENT = """\
name: ray-cells
trials: 1
verify: {{enabled: false}}
bench: {{single_requests: 3, max_tokens: 8, sweep: false}}
cells:
  - {{name: here, url: "{url}"}}
  - {{name: there, url: "{url}", on: "ray:GPU=8"}}
"""


def test_an_experiment_cell_placed_on_a_ray_node_is_measured_there_and_comes_back(cluster, tmp_path):
    exp = tmp_path / "exp.yaml"
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=8)) as cal:
        exp.write_text(EXPERIMENT.format(url=cal.url))
        code, done = run(["run", str(exp), "--out", str(tmp_path / "runs"), "--reruns", "0"], cluster.env,
                         tmp_path, timeout=240)
    assert code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = json.loads(next((tmp_path / "runs").glob("*-ray-cells/experiment.json")).read_text())
    cells = {c["name"]: c for c in state["cells"]}
    assert cells["here"]["status"] == cells["there"]["status"] == "complete"
    there = RunSummary.model_validate_json((Path(cells["there"]["run_dir"]) / "summary.json").read_text())
    assert there.provenance.ran_on == "ray:GPU=8"
    assert [t.status for t in there.trials] == ["complete"]
    assert there.trials[0].steps[0].result.levels[0].ok == 3
    assert list(Path(cells["there"]["run_dir"]).glob("records.jsonl*")), "the cell's records did not come back"
    # The far side's job, under the root the cluster was started with: a one-cell `servelab run` there.
    (job,) = cluster.far_root.iterdir()
    assert json.loads((job / "job.json").read_text())["argv"][0] == "run"
    assert gpus_free_again()


def test_no_cluster_at_the_address_is_one_line_at_once(tmp_path):
    import socket

    with socket.socket() as s:  # a port of 127.0.0.1 that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    code, bench = run(["bench", "http://127.0.0.1:9", "--on", "ray:GPU=1", "--out", str(tmp_path)],
                      {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}, tmp_path, timeout=120)
    assert code == 2, bench.stdout + bench.stderr
    (error,) = [line for line in bench.err if line.strip()] or [""]
    assert error.startswith(f"error: no Ray cluster to place ray:GPU=1 on: nothing answers at 127.0.0.1:{port} "), \
        bench.stderr
    assert "ray start --head" in error
    assert time.monotonic() - started < 60  # Ray's own connect would retry for minutes


def test_the_link_carries_stdin_and_a_stream_larger_than_a_read_whole_and_in_order(cluster):
    """What `start` (stdin) and `pack` (a stream of many reads) rely on, through the actor."""
    import hashlib
    import sys

    write = ("import sys, hashlib; data = b''.join(hashlib.sha256(str(i).encode()).digest() for i in range(100000));"
             " sys.stdout.buffer.write(data); sys.stderr.write('done')")
    with RayLink.open(RayPlacement.parse("ray:GPU=1")) as link:
        echoed = link.run([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read()[::-1])"],
                          stdin=b"alive\nstop\n")
        assert (echoed.returncode, echoed.stdout) == (0, b"\npots\nevila")
        proc = link.popen([sys.executable, "-c", write])
        proc.stdin.close()
        received = proc.stdout.read()
        assert proc.wait(30) == 0 and proc.stderr.read() == b"done"
    expected = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(100000))
    assert len(received) == 3_200_000 and received == expected  # three full reads and a part, none lost or doubled
    assert gpus_free_again()


SECRET = "sk-test-SECRET0123456789abcdef"


def _everything_ray_recorded() -> str:
    """The cluster's job and actor tables as the GCS holds them (what the dashboard and `ray list jobs` /
    `ray list actors` show; the state API's server is the dashboard, which this cluster runs without)."""
    from ray._private import state

    return repr(state.jobs()) + repr(state.actors())


def test_an_api_key_on_the_command_line_is_not_in_ray_s_job_or_actor_tables(cluster, tmp_path):
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=8)) as cal:
        for placed in (["--on", "ray:GPU=8", "--remote-dir", str(tmp_path / "far")],
                       ["--workers", "1", "--ray", "auto"]):
            code, bench = run(["bench", cal.url, "--api-key", SECRET, "--mode", "concurrency", "--concurrency", "1",
                               "--requests", "2", "--warmup", "0", "--max-tokens", "8", "--tokenizer", "none",
                               "--out", str(tmp_path / "local"), *placed], cluster.env, tmp_path, timeout=180)
            assert code == 0, bench.stdout + bench.stderr
    recorded = _everything_ray_recorded()
    # both drivers are there, by their command lines with the key hidden
    assert recorded.count("--api-key ***") >= 2, recorded[-3000:]
    assert SECRET not in recorded and "SECRET0123" not in recorded
    assert gpus_free_again()


def test_the_far_side_s_processes_get_the_node_s_environment_not_ray_s_and_no_gpu_unless_held(cluster):
    import sys

    show = "import json, os; print(json.dumps(dict(os.environ)))"
    with RayLink.open(RayPlacement.parse("ray:GPU=2")) as link:  # CPU 0: Ray sets OMP_NUM_THREADS=1 for it
        env = json.loads(link.run([sys.executable, "-c", show]).stdout)
        # what the raylet, started with the user's environment, has: Ray's worker bookkeeping is not in it
        (raylet,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]
        node = raylet.environ()
        assert env.get("OMP_NUM_THREADS") == node.get("OMP_NUM_THREADS")
        assert env.get("PYTHONBREAKPOINT") == node.get("PYTHONBREAKPOINT")
        rays = {k: v for k, v in env.items() if k.startswith("RAY_")}
        assert rays == {k: v for k, v in node.items() if k.startswith("RAY_")}
        assert "RAY_RAYLET_PID" not in env and "RAY_JOB_ID" not in env
        assert env["SERVELAB_REMOTE_ROOT"] == str(cluster.far_root)  # the node's own environment is kept
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    with RayLink.open(RayPlacement.parse("ray:CPU=1")) as link:
        assert link.placed_note.endswith('holding ray:CPU=1 (CUDA_VISIBLE_DEVICES="", no GPU held)')
        env = json.loads(link.run([sys.executable, "-c", show]).stdout)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        streamed = link.popen([sys.executable, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"])
        streamed.stdin.close()
        assert streamed.stdout.read() == b"''\n" and streamed.wait(30) == 0
    assert gpus_free_again()


def test_a_remote_python_that_cannot_be_run_is_one_true_line_not_a_dropped_link(cluster, tmp_path):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\n")  # not executable
    started = time.monotonic()
    code, bench = run(["bench", "http://127.0.0.1:9", "--on", "ray:GPU=1", "--remote-python", str(python),
                       "--out", str(tmp_path)], cluster.env, tmp_path, timeout=120)
    assert code != 0, bench.stdout + bench.stderr
    assert "Permission denied" in bench.stderr and "ray::" not in bench.stderr, bench.stderr
    no_traceback(bench.stderr)
    assert time.monotonic() - started < 60  # not a reconnect for the grace period and more
    assert gpus_free_again()

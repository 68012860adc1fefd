"""An experiment with one cell here and one on another host (`on: ssh://…`), through a real sshd on 127.0.0.1:
both cells measured, the remote one's trials, records and provenance copied back into this experiment, and
`compare` reading the two from one store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.records import RunSummary

EXPERIMENT = """\
name: two-hosts
trials: 1
verify: {{enabled: false}}
bench: {{single_requests: 3, max_tokens: 8, sweep: false}}
cells:
  - {{name: here, engine: replay-sglang, model: smollm2, options: {{speed: "60"}}}}
  - name: there
    engine: replay-sglang
    model: smollm2
    options: {{speed: "60"}}
    on: {url}
"""


def servelab(*args: str, env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


# The slow tier (CI runs it): a two-cell experiment, one cell through sshd, ~20 s on two cores
@pytest.mark.slow
def test_a_cell_on_another_host_is_measured_there_and_compared_here(ssh_host, tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT.format(url=ssh_host.url))  # a bare `on:` key, as people write it
    env = {**os.environ, **ssh_host.env}
    done = servelab("run", str(exp), "--out", str(tmp_path / "runs"), "--reruns", "0", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = json.loads(next((tmp_path / "runs").glob("*-two-hosts/experiment.json")).read_text())
    cells = {c["name"]: c for c in state["cells"]}
    assert cells["here"]["status"] == cells["there"]["status"] == "complete"

    there = RunSummary.model_validate_json((Path(cells["there"]["run_dir"]) / "summary.json").read_text())
    assert there.provenance.ran_on == ssh_host.url
    assert there.launch is not None and there.launch.verdict.state == "ready"
    assert [t.status for t in there.trials] == ["complete"]
    single = there.trials[0].steps[0].result.levels[0]
    assert single.ok == 3
    records = list(Path(cells["there"]["run_dir"]).glob("records.jsonl*"))
    assert records, "the remote cell's records were not copied back"

    # the far side kept its job (the harness gives the session a HOME of its own)
    jobs = list((ssh_host.remote_home / ".servelab" / "remote").iterdir())
    assert len(jobs) == 1 and json.loads((jobs[0] / "job.json").read_text())["argv"][0] == "run"

    compared = servelab("compare", cells["here"]["run_id"], cells["there"]["run_id"], "--out",
                        str(tmp_path / "runs"), "--json", env=env, cwd=tmp_path, timeout=120)
    assert compared.returncode == 0, compared.stderr
    names = json.dumps(json.loads(compared.stdout))
    assert cells["there"]["run_id"] in names and cells["here"]["run_id"] in names


def test_an_experiment_names_a_bad_on_url_before_anything_starts(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT.format(url="http://gpu-box"))
    done = servelab("run", str(exp), "--out", str(tmp_path / "runs"), env=dict(os.environ), cwd=tmp_path,
                    timeout=60)
    assert done.returncode == 2
    assert "not an ssh:// URL" in done.stderr and "Traceback" not in done.stderr


def test_remote_python_and_remote_dir_reach_a_cell_there_and_leave_its_key_alone(ssh_host, tmp_path: Path) -> None:
    """`remote_python` and `remote_dir` (the experiment's, or a cell's own) say how a cell is reached there, as
    --remote-python and --remote-dir do: the job runs under that interpreter, in that directory, and the cell's
    key and the far side's experiment file are what they are without them."""
    from servelab.calibration import Script, start_calibration_server
    from servelab.experiment.load import parse_experiment

    far = tmp_path / "far-jobs"
    with start_calibration_server(Script(ttft_ms=2, itl_ms=2, output_tokens=4)) as cal:
        text = (f"name: reached\ntrials: 1\nverify: {{enabled: false}}\ncontention: {{reruns: 0}}\n"
                f"bench: {{single_requests: 2, max_tokens: 4, sweep: false, warmup: 0}}\n"
                f"remote_python: {sys.executable}\n"
                f"cells:\n  - {{name: there, url: '{cal.url}', on: '{ssh_host.url}', remote_dir: '{far}'}}\n")
        exp_file = tmp_path / "exp.yaml"
        exp_file.write_text(text)
        done = servelab("run", str(exp_file), "--out", str(tmp_path / "runs"), "--reruns", "0",
                        env={**os.environ, **ssh_host.env}, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (job,) = far.iterdir()  # the cell's own remote_dir, not ~/.servelab/remote
    assert json.loads((job / "job.json").read_text())["argv"][0] == "run"
    assert not (ssh_host.remote_home / ".servelab" / "remote").exists()

    exp = parse_experiment(text, "exp.yaml")
    (cell,) = exp.cells
    assert exp.reached_by(cell) == (sys.executable, str(far))
    there = exp.one_cell_there(cell)
    assert "remote_python" not in there and "remote_dir" not in there["cells"][0] and "on" not in there["cells"][0]
    plain = parse_experiment(text.replace(f"remote_python: {sys.executable}\n", "")
                             .replace(f", remote_dir: '{far}'", ""), "exp.yaml")
    assert plain.cell_key(plain.cells[0]) == exp.cell_key(cell)


def test_remote_python_on_a_cell_that_runs_here_is_refused_naming_it(tmp_path: Path) -> None:
    from servelab.errors import UserError
    from servelab.experiment.load import parse_experiment

    with pytest.raises(UserError) as caught:
        parse_experiment("name: e\ncells:\n  - {name: a, url: 'http://127.0.0.1:9', remote_python: /opt/py}\n",
                         "e.yaml")
    assert "cell 'a' sets remote_python but runs here" in str(caught.value)

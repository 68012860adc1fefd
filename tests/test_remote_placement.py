"""`--on` and an experiment's `on:` beside ssh://: a Ray placement by resources (`ray:GPU=8`), parsed without Ray,
each bad spec refused in one line that says what is wrong; servelab imports none of Ray until a placement is
used, and says in one line when Ray is not there."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelab.errors import UserError
from servelab.experiment.model import Experiment
from servelab.remote.placement import RayPlacement, is_ray, parse_on
from servelab.remote.target import SshTarget


@pytest.mark.parametrize("spec, wanted, options", [
    ("ray:GPU=8", {"GPU": 8}, {"num_cpus": 0, "num_gpus": 8}),
    ("ray:GPU=8,CPU=4", {"GPU": 8, "CPU": 4}, {"num_cpus": 4, "num_gpus": 8}),
    ("ray: gpu = 2 , cpu=0.5", {"GPU": 2, "CPU": 0.5}, {"num_cpus": 0.5, "num_gpus": 2}),
    ("ray:accelerator_type_H100=1", {"accelerator_type_H100": 1},
     {"num_cpus": 0, "num_gpus": 0, "resources": {"accelerator_type_H100": 1}}),
    ("ray:GPU=8,accelerator_type:H100=1", {"GPU": 8, "accelerator_type:H100": 1},
     {"num_cpus": 0, "num_gpus": 8, "resources": {"accelerator_type:H100": 1}}),
    ("ray:GPU=1,memory=2000000000", {"GPU": 1, "memory": 2e9}, {"num_cpus": 0, "num_gpus": 1, "memory": 2000000000}),
])
def test_a_ray_placement_names_its_resources_as_ray_takes_them(spec, wanted, options):
    placement = parse_on(spec)
    assert isinstance(placement, RayPlacement)
    assert placement.wanted == wanted
    assert placement.actor_options() == options
    assert RayPlacement.parse(str(placement)) == placement  # what messages and provenance name reads back
    assert is_ray(spec)


def test_the_placement_is_written_back_in_ray_s_own_spelling():
    assert str(RayPlacement.parse("ray:gpu=8,cpu=4")) == "ray:GPU=8,CPU=4"
    assert str(RayPlacement.parse("ray:GPU=0.5")) == "ray:GPU=0.5"


@pytest.mark.parametrize("spec, words", [
    ("ray:", "names no resources"),
    ("ray:GPU", "'GPU' in 'ray:GPU' is not RESOURCE=N"),
    ("ray:=8", "'=8' in 'ray:=8' is not RESOURCE=N"),
    ("ray:GPU=eight", "the amount must be a number above 0"),
    ("ray:GPU=0", "the amount must be a number above 0"),
    ("ray:GPU=-1", "the amount must be a number above 0"),
    ("ray:GPU=nan", "the amount must be a number above 0"),
    ("ray:GPU=inf", "the amount must be a number above 0"),
    ("ray:GPU=8,gpu=4", "names GPU twice"),
    ("ray:GPU=8,,CPU=1", "'' in 'ray:GPU=8,,CPU=1' is not RESOURCE=N"),
    ("ray:8gpus=1", "'8gpus' in 'ray:8gpus=1' is not a resource name"),
    ("ray:GPU;rm=1", "is not a resource name"),
    ("ray:memory=1.5", "memory is a whole number of bytes"),
    ("ray://head:10001", "is a Ray client address, not a placement"),
])
def test_a_bad_ray_placement_is_one_line_saying_what_is_wrong(spec, words):
    with pytest.raises(UserError) as raised:
        parse_on(spec)
    assert words in raised.value.message
    assert "\n" not in str(raised.value)
    assert "ray:GPU=8" in (raised.value.hint or "")  # and how it is written


def test_on_is_an_ssh_url_or_a_ray_placement_and_nothing_else():
    assert parse_on("ssh://root@gpu-box:2222") == SshTarget("gpu-box", "root", 2222)
    assert not is_ray("ssh://gpu-box") and not is_ray(None)
    with pytest.raises(UserError, match="is not an ssh:// URL nor a Ray placement") as raised:
        parse_on("gpu-box")
    assert "ray:RESOURCE=N" in raised.value.hint
    with pytest.raises(UserError, match="password"):
        parse_on("ssh://me:secret@gpu-box")


def test_an_experiment_places_a_cell_on_a_ray_node_by_resources():
    doc = {"name": "x", "on": "ray:GPU=8", "cells": [{"name": "a", "url": "http://127.0.0.1:1"},
                                                     {"name": "b", "url": "http://127.0.0.1:2",
                                                      "on": "ray:GPU=4,accelerator_type_H100=1"},
                                                     {"name": "c", "url": "http://127.0.0.1:3",
                                                      "on": "ssh://gpu-box"}]}
    experiment = Experiment.model_validate(doc)
    assert [experiment.host_of(c) for c in experiment.cells] == ["ray:GPU=8", "ray:GPU=4,accelerator_type_H100=1",
                                                                 "ssh://gpu-box"]
    # as Ray spells it, however the file wrote it: what the cell's key and its run's ran_on name
    spelled = Experiment.model_validate({**doc, "on": "ray: gpu=8.0 ,cpu=2"})
    assert spelled.host_of(spelled.cells[0]) == "ray:GPU=8,CPU=2"
    # The far side runs the cell where it is: its one-cell file names no placement of its own.
    there = experiment.one_cell_there(experiment.cells[1])
    assert "on" not in there and all("on" not in c for c in there["cells"])


def test_where_a_cell_is_placed_is_part_of_what_it_is():
    def key(on: str) -> str:
        experiment = Experiment.model_validate({"name": "x", "on": on,
                                                "cells": [{"name": "a", "url": "http://127.0.0.1:1"}]})
        return experiment.cell_key(experiment.cells[0])

    assert key("ray:GPU=8") == key("ray:GPU=8") == key("ray: gpu = 8") == key("ray:GPU=8.0")
    assert len({key("ray:GPU=8"), key("ray:GPU=4"), key("ssh://gpu-box")}) == 3


@pytest.mark.parametrize("on, words", [
    ("ray:GPU", "is not RESOURCE=N"),
    ("ray:GPU=0", "above 0"),
    ("gpu-box", "is not an ssh:// URL nor a Ray placement"),
])
def test_a_bad_on_in_an_experiment_is_an_error_of_the_file(on, words):
    with pytest.raises(ValueError, match=words):
        Experiment.model_validate({"name": "x", "cells": [{"name": "a", "url": "http://127.0.0.1:1", "on": on}]})
    with pytest.raises(ValueError, match=words):
        Experiment.model_validate({"name": "x", "on": on, "cells": [{"name": "a", "url": "http://127.0.0.1:1"}]})


# Records every attempt to import Ray, found or not: where Ray is not installed, `'ray' in sys.modules` would stay
# False even for a servelab that tried (and caught the ImportError).
_NO_RAY_IMPORT = """
import sys

tried = []


class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            tried.append(name)
        return None


sys.meta_path.insert(0, Recorder())
import servelab.cli, servelab.remote.commands, servelab.remote.placement, servelab.remote.controller
import servelab.experiment.model
from servelab.experiment.model import Experiment
from servelab.remote.placement import parse_on

parse_on("ray:GPU=8")
Experiment.model_validate({"name": "x", "on": "ray:GPU=8", "cells": [{"name": "a", "url": "http://127.0.0.1:1"}]})
print("tried:", tried)
sys.exit(1 if tried or "ray" in sys.modules else 0)
"""


def test_servelab_imports_no_ray_until_a_placement_is_used():
    done = subprocess.run([sys.executable, "-c", _NO_RAY_IMPORT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "tried: []"
    # and the recorder does hear an import of Ray, installed or not
    tried = subprocess.run([sys.executable, "-c", _NO_RAY_IMPORT.replace(
        'print("tried:"', 'import contextlib\nwith contextlib.suppress(ImportError):\n    import ray\nprint("tried:"')],
        capture_output=True, text=True, timeout=60)
    assert tried.returncode == 1 and "'ray'" in tried.stdout, tried.stdout + tried.stderr


def test_a_placement_without_ray_installed_is_one_line(monkeypatch):
    from servelab.remote.commands import _open

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    with pytest.raises(UserError, match=r"--on ray:… needs Ray, which is not installed here") as raised:
        _target, opening = _open("ray:GPU=8")
        with opening:
            pass
    assert "servelab[ray]" in raised.value.hint


def test_attach_refuses_a_ray_placement_and_says_how_to_reach_the_node():
    from servelab.remote.commands import attach
    from servelab.remote.controller import RemoteOptions

    with pytest.raises(UserError, match="attach follows a job over ssh:// only") as raised:
        attach("ray:GPU=8", "/root/.servelab/remote/x", RemoteOptions(), None, None, None)
    assert "servelab attach ssh://NODE JOB_DIR" in raised.value.hint


class _Nodes:
    """Ray's `nodes()`, as much of it as the feasibility check reads."""

    def __init__(self, *nodes: tuple[bool, dict[str, float]]):
        self._nodes = [{"Alive": alive, "Resources": resources} for alive, resources in nodes]

    def nodes(self):
        return self._nodes


def _feasibility(spec: str, ray) -> None:
    from servelab.remote.ray_link import RayLink

    link = RayLink.__new__(RayLink)  # no Ray here: only the check, against the nodes given
    link.target, link.ray = RayPlacement.parse(spec), ray
    link._check_feasible()


CLUSTER = _Nodes((True, {"CPU": 64, "GPU": 8, "memory": 1e12}),
                 (True, {"CPU": 16, "GPU": 4, "accelerator_type:H100": 1}),
                 (False, {"CPU": 256, "GPU": 16, "accelerator_type:B200": 1}))  # dead: counts for nothing


@pytest.mark.parametrize("spec", ["ray:GPU=8", "ray:GPU=4,accelerator_type:H100=1", "ray:GPU=0.5,CPU=64"])
def test_a_placement_some_live_node_can_hold_passes_the_check(spec):
    _feasibility(spec, CLUSTER)


@pytest.mark.parametrize("spec, message", [
    ("ray:GPU=16", "no node of the Ray cluster has GPU=16 (2 nodes; the most any has: GPU=8)"),
    ("ray:GPU=8,accelerator_type:B200=1",
     "no node of the Ray cluster has accelerator_type:B200=1 (2 nodes; the most any has: accelerator_type:B200=0)"),
    ("ray:CPU=100,GPU=9", "no node of the Ray cluster has CPU=100, GPU=9 (2 nodes; the most any has: CPU=64, GPU=8)"),
    ("ray:GPU=8,accelerator_type:H100=1",
     "no node of the Ray cluster has all of ray:GPU=8,accelerator_type:H100=1 at once (each resource is on some "
     "node, not all of them on one)"),
])
def test_a_placement_no_live_node_can_hold_says_which_resources_at_once(spec, message):
    with pytest.raises(UserError) as raised:
        _feasibility(spec, CLUSTER)
    assert raised.value.message == message


def test_a_cluster_with_no_live_node_holds_nothing():
    with pytest.raises(UserError, match=r"has GPU=1 \(0 nodes; the most any has: GPU=0\)"):
        _feasibility("ray:GPU=1", _Nodes((False, {"GPU": 8})))

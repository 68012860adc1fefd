"""The Ray link's two halves without Ray: the actor (LinkActor) runs its commands here, called through a fake
actor handle whose `.remote` runs the method in a thread, and this side's RayLink/RayProcess wait on those calls
through a fake `ray.wait`/`ray.get`. What is checked: a stream killed from here is killed there, also once the
pump has ended; a pump that ends on an error kills the command there; an `open` that went unanswered leaves no
command running there; a command that cannot be started is one true line (126/127); the children start with no
signal blocked; the far side's environment is the user's, not Ray's bookkeeping."""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from servelab.remote import ray_link
from servelab.remote.link import LINK_FAILED
from servelab.remote.placement import RayPlacement
from servelab.remote.ray_link import LinkActor, RayLink


class _RayError(Exception):
    pass


class _ActorDied(_RayError):
    pass


class _FakeRay:
    exceptions = SimpleNamespace(RayError=_RayError, ActorDiedError=_ActorDied)

    @staticmethod
    def wait(refs, timeout=None, num_returns=1):
        deadline = time.monotonic() + (timeout or 0)
        while True:
            ready = [r for r in refs if r.done()]
            if ready or time.monotonic() >= deadline:
                return ready, [r for r in refs if not r.done()]
            time.sleep(0.01)

    @staticmethod
    def get(ref):
        return ref.result()

    @staticmethod
    def get_gpu_ids():
        return []


class _Method:
    def __init__(self, handle: _FakeActor, name: str):
        self.handle, self.name = handle, name

    def remote(self, *args):
        self.handle.calls.append(self.name)
        ref: Future = Future()

        def call():
            try:
                if fault := self.handle.faults.get(self.name):
                    fault()
                ref.set_result(getattr(self.handle.actor, self.name)(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as Ray does
                ref.set_exception(exc)

        threading.Thread(target=call, daemon=True).start()
        return ref


class _FakeActor:
    """An actor handle: each `handle.method.remote(...)` runs LinkActor's method in a thread of its own (the real
    actor is threaded too); `faults[name]` runs first, to delay or fail the call."""

    def __init__(self, actor: LinkActor):
        self.actor, self.calls, self.faults = actor, [], {}

    def __getattr__(self, name):
        return _Method(self, name)


@pytest.fixture
def link(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _FakeRay)  # LinkActor's own `import ray` (get_gpu_ids)
    monkeypatch.setattr(ray_link, "_node_environ", lambda: {})
    handle = _FakeActor(LinkActor())
    made = RayLink.__new__(RayLink)
    made.target, made.ray, made.actor, made.name, made.node, made._dead = (RayPlacement.parse("ray:GPU=1"), _FakeRay,
                                                                           handle, "servelab-link-test", {}, None)
    made._started_ray = False
    return made


SPEAK_THEN_SLEEP = "import sys, time; print('up', flush=True); time.sleep(300)"


def _far_procs(handle: _FakeActor):
    return [s.proc for s in handle.actor._streams.values() if s.proc is not None]


def _ended(proc, timeout_s: float = 20.0) -> bool:
    try:
        proc.wait(timeout_s)
    except Exception:  # noqa: BLE001 - still running
        return False
    return True


def test_a_stream_killed_from_here_is_killed_there(link):
    proc = link.popen([sys.executable, "-c", SPEAK_THEN_SLEEP])
    assert proc.stdout.readline() == b"up\n"
    (far,) = _far_procs(link.actor)
    proc.kill()
    assert proc.wait(20) == -9
    assert _ended(far) and far.returncode == -signal.SIGKILL
    assert not link.actor.actor._streams


def test_kill_after_the_pump_ended_still_kills_there(link):
    proc = link.popen([sys.executable, "-c", SPEAK_THEN_SLEEP])
    assert proc.stdout.readline() == b"up\n"
    (far,) = _far_procs(link.actor)
    proc._stopping.set()  # the pump ends as if on its own; the command there is still running
    proc.wait(20)
    link.actor.calls.clear()
    proc.kill()
    assert "kill" in link.actor.calls
    assert _ended(far)


def test_a_pump_that_ends_on_an_error_kills_the_command_there(link):
    proc = link.popen([sys.executable, "-c", SPEAK_THEN_SLEEP])
    assert proc.stdout.readline() == b"up\n"
    (far,) = _far_procs(link.actor)

    def broken():
        raise _RayError("the runtime went away")

    link.actor.faults["read"] = broken
    assert proc.wait(20) == LINK_FAILED
    assert _ended(far), "the command there outlived the pump"
    assert not link.actor.actor._streams, "its buffer is still held there"


def test_an_open_that_went_unanswered_leaves_no_command_running_there(link, monkeypatch):
    monkeypatch.setattr(ray_link, "CALL_TIMEOUT_S", 0.3)
    release = threading.Event()
    started: list = []

    class Recorded(ray_link._Stream):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(ray_link, "_Stream", Recorded)
    link.actor.faults["open"] = lambda: release.wait(20)
    proc = link.popen([sys.executable, "-c", SPEAK_THEN_SLEEP])
    assert proc.wait(20) == LINK_FAILED  # no answer in time: a dropped link, the controller reconnects
    deadline = time.monotonic() + 20
    while proc.sid not in link.actor.actor._killed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.sid in link.actor.actor._killed, "this side did not kill the stream it gave up on"
    release.set()  # the open arrives there after this side gave up on it
    deadline = time.monotonic() + 20
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    (stream,) = started
    assert _ended(stream.proc), "the late command was left running there"
    assert not link.actor.actor._streams, "the late stream was kept"


def test_a_command_that_cannot_be_started_is_one_true_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _FakeRay)
    monkeypatch.setattr(ray_link, "_node_environ", lambda: {})
    actor = LinkActor()
    not_executable = tmp_path / "python3"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(stat.S_IRUSR | stat.S_IWUSR)
    code, out, err = actor.run([str(not_executable), "-m", "servelab.cli", "remote", "hello"], None, 10)
    assert (code, out) == (126, b"") and err.decode() == f"{not_executable}: Permission denied"
    code, _out, err = actor.run([str(tmp_path / "nowhere"), "-V"], None, 10)
    assert code == 127 and err.decode() == f"{tmp_path / 'nowhere'}: command not found"
    actor.open("s1", [str(not_executable), "-V"])
    assert actor.read("s1", 0, 1, 100) == (b"", True, 126, f"{not_executable}: Permission denied".encode())


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads a process's signal mask in /proc")
def test_the_far_side_s_processes_start_with_no_signal_blocked_and_the_actor_s_mask_is_kept(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _FakeRay)
    monkeypatch.setattr(ray_link, "_node_environ", lambda: {})
    actor = LinkActor()
    show = "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('SigBlk')][0])"
    seen: dict = {}

    def as_ray_s_thread():  # Ray's threads run with SIGINT blocked
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        seen["run"] = actor.run([sys.executable, "-c", show], None, 30)
        actor.open("s", [sys.executable, "-c", show])
        data, ended = b"", False
        while not ended:  # to the end, as this side's pump reads
            chunk, ended, code, _err = actor.read("s", len(data), 30, 100)
            data += chunk
        seen["open"] = (data, code)
        seen["after"] = signal.pthread_sigmask(signal.SIG_BLOCK, set())

    thread = threading.Thread(target=as_ray_s_thread)
    thread.start()
    thread.join(60)
    assert seen["run"][0] == 0 and int(seen["run"][1], 16) == 0, seen["run"]
    data, code = seen["open"]
    assert code == 0 and int(data, 16) == 0
    assert {signal.SIGINT, signal.SIGTERM} <= seen["after"]


def test_the_far_side_s_environment_is_the_user_s_not_ray_s_bookkeeping(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # Ray's, for a worker that holds no CPU
    monkeypatch.setenv("RAY_JOB_ID", "01000000")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # the user's: the raylet has it too
    monkeypatch.setenv("HF_HOME", "/models/hf")
    monkeypatch.setenv("PYTHONBREAKPOINT", "ray.util.rpdb.set_trace")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(ray_link, "_node_environ", lambda: {"RAY_USAGE_STATS_ENABLED": "0", "HF_HOME": "/x"})
    env = ray_link._far_env([])
    assert "OMP_NUM_THREADS" not in env and "RAY_JOB_ID" not in env and "PYTHONBREAKPOINT" not in env
    assert env["RAY_USAGE_STATS_ENABLED"] == "0" and env["HF_HOME"] == "/models/hf"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU held: none seen
    # OMP_NUM_THREADS the user started the node with is theirs; GPUs Ray gave are left as Ray set them
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(ray_link, "_node_environ", lambda: {"OMP_NUM_THREADS": "8"})
    env = ray_link._far_env([3, 5])
    assert env["OMP_NUM_THREADS"] == "8" and env["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_the_placed_note_says_when_no_gpu_is_held(link):
    link.node = {"ip": "10.0.0.7", "host": "cpu-7", "gpus": ""}
    assert link.placed_note.endswith('holding ray:GPU=1 (CUDA_VISIBLE_DEVICES="", no GPU held)')
    link.node["gpus"] = "0,1"
    assert link.placed_note.endswith("holding ray:GPU=1 (CUDA_VISIBLE_DEVICES=0,1)")


def test_first_line_of_what_ray_raised_is_what_went_wrong_not_its_header():
    from servelab.ray_support import first_line

    assert first_line(ValueError("no cluster\nsecond line")) == "ValueError: no cluster"
    exceptions = pytest.importorskip("ray.exceptions")
    cause = PermissionError(13, "Permission denied")
    task = exceptions.RayTaskError("LinkActor.run", "Traceback (most recent call last):\n  ...\nPermissionError: "
                                   "[Errno 13] Permission denied", cause, proctitle="ray::LinkActor.run", pid=12,
                                   ip="127.0.0.1")
    header = str(task).splitlines()[0]  # Ray's header, which says nothing of what went wrong
    assert "ray::LinkActor.run()" in header and "(pid=12, ip=127.0.0.1)" in header
    assert first_line(task) == "PermissionError: [Errno 13] Permission denied"
    assert first_line(task.as_instanceof_cause()) == "PermissionError: [Errno 13] Permission denied"
    died = exceptions.RayActorError(error_msg="The actor died unexpectedly before finishing this task.\n"
                                              "\tclass_name: LinkActor\n\tpid: 12\n"
                                              "The actor is dead because it was killed by `ray.kill`.\n")
    assert first_line(died) == "RayActorError: The actor is dead because it was killed by `ray.kill`."

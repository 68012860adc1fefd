"""A real OpenSSH server on 127.0.0.1 for the tests of remote hosts, and the ssh client config that reaches it.

`start_ssh_host(directory)` runs Debian's `/usr/sbin/sshd -D -e -f <generated sshd_config>` as the current user
(root or not), listening on 127.0.0.1 only, on a free port, with a generated ed25519 host key and a generated user
key. Public-key authentication only: no password, no keyboard-interactive, no PAM. Its pid file and log are in the
directory it is given. It writes a client config (`Host servelab-test`, also matched by `127.0.0.1`) with the
identity, a known_hosts of its own and `StrictHostKeyChecking yes`, `BatchMode yes`; ControlMaster and ControlPath
are left to the caller. `SshHost.env` names that config in SERVELAB_SSH_CONFIG, which servelab's remote code turns
into `ssh -F <path>`.

The session's environment is sshd's own fixed one plus `SetEnv` (OpenSSH >= 8.7): PATH starts with the running
interpreter's bin directory, so `servelab` is found on the far side; HOME is a directory of the host's own (no
dotfiles of the real user's run, and what the far side writes under ~ stays in the test's directory; the working
directory is still the user's home from passwd, which sshd enters); SERVELAB_LOOPBACK_ONLY is passed on when set
(the remote servelab guards its traffic as the local one does); and a tag names this host so that every process
started through it can be found again (`session_processes`), even after its session is gone. Nothing is accepted
from the client's environment (no AcceptEnv).

Trust variants for the tests of host-key checking: `known_hosts="matching"` (the default) holds the server's key,
`"changed"` holds another ed25519 key for the same host and port (OpenSSH's "REMOTE HOST IDENTIFICATION HAS
CHANGED"), `"unknown"` holds nothing (with StrictHostKeyChecking yes: "Host key verification failed.").

As root, sshd insists on its privilege-separation directory /run/sshd (which systemd makes at boot and a container
lacks): it is created, empty and 0755, as the Debian unit does. As another user sshd needs no such directory and can
log in only that user, which is the one the client config names.

Faults: `kill_sessions()` SIGKILLs the per-connection sshd processes (the connection drops at once: ssh exits 255,
"Connection to 127.0.0.1 closed by remote host."), `pause_sessions()` SIGSTOPs them (the link is silent but open,
as when a host dies: only the client's ServerAlive probes notice), `resume_sessions()` continues them; the listener
keeps accepting throughout. `session_processes()` lists what the sessions started, still running.

Pytest fixtures (registered in conftest.py): `ssh_host`, `ssh_host_changed_key`, `ssh_host_unknown_key`, each a
fresh server for one test, skipped with the reason when openssh-server is not installed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
NOT_INSTALLED = "openssh-server is not installed: apt-get install openssh-server"
ALIAS = "servelab-test"
PRIVSEP_DIR = Path("/run/sshd")
TAG_ENV = "SERVELAB_SSH_HOST_TAG"  # set in every session by the server's SetEnv; names the host that started it
START_DEADLINE_S = 10.0
KNOWN_HOSTS_VARIANTS = ("matching", "changed", "unknown")


class SshHostUnavailable(RuntimeError):
    """sshd cannot be run here; the message says why (the fixtures skip with it)."""


@dataclass
class SshHost:
    alias: str
    port: int
    user: str
    directory: Path
    config_path: Path
    known_hosts_path: Path
    identity_path: Path
    host_key_path: Path
    log_path: Path
    pid_path: Path
    remote_home: Path  # HOME in every session: a directory of this host's own
    control_dir: Path  # a short directory for ControlPath sockets (a unix socket's path must fit in ~104 bytes)
    tag: str
    process: subprocess.Popen = field(repr=False)
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def ssh_command(self, *remote: str, options: tuple[str, ...] = ()) -> list[str]:
        return ["ssh", "-F", str(self.config_path), *options, self.alias, *remote]

    def run(self, cmd: str, *, timeout: float = 20.0, options: tuple[str, ...] = (),
            input: str | None = None) -> subprocess.CompletedProcess:
        """`ssh -F config servelab-test cmd`, text output captured, within `timeout` seconds."""
        return subprocess.run(self.ssh_command(cmd, options=options), env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)

    def listener_alive(self) -> bool:
        return self.process.poll() is None

    def _session_sshds(self) -> list[psutil.Process]:
        """The per-connection sshd processes: the listener's children and the sshd processes under them (a non-root
        login's privilege-separated child), not the commands they run."""
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            found.append(child)
            try:
                found.extend(p for p in child.children(recursive=True) if _is_sshd(p))
            except psutil.NoSuchProcess:
                pass
        return found

    def kill_sessions(self) -> list[int]:
        """SIGKILL every per-connection sshd, keeping the listener: the clients see their connection drop (ssh exits
        255) and the commands they ran lose their stdin and stdout as when a link dies. Returns the pids killed."""
        sessions = self._session_sshds()
        killed = self._signal_sessions(signal.SIGKILL, sessions)
        psutil.wait_procs([p for p in sessions if p.pid in killed], timeout=5)
        return killed

    def pause_sessions(self) -> list[int]:
        """SIGSTOP every per-connection sshd: the TCP connections stay open but nothing answers, as when the link
        or the host dies without a FIN. The client notices only by its keep-alives (ServerAliveInterval *
        ServerAliveCountMax). Returns the pids stopped; `resume_sessions` continues them."""
        return self._signal_sessions(signal.SIGSTOP)

    def resume_sessions(self) -> list[int]:
        return self._signal_sessions(signal.SIGCONT)

    def _signal_sessions(self, signum: int, sessions: list[psutil.Process] | None = None) -> list[int]:
        sent = []
        for proc in self._session_sshds() if sessions is None else sessions:
            try:
                proc.send_signal(signum)
                sent.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return sent

    def session_processes(self) -> list[psutil.Process]:
        """Every live process started through this server (it carries the server's tag in its environment), sshd's
        own excluded: what would be left behind on the remote host."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(TAG_ENV) == self.tag and not _is_sshd(proc):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def accepts(self, timeout: float = 1.0) -> bool:
        """A TCP connection to the listener succeeds and it sends OpenSSH's banner."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
                return sock.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    def stop(self) -> None:
        """The listener, every session, and what the sessions started (found by the tag) are killed; the control
        socket directory is removed."""
        leftovers = self.session_processes()
        for proc in [*self._session_sshds(), *leftovers]:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.control_dir, ignore_errors=True)


def _is_sshd(proc: psutil.Process) -> bool:
    try:
        return proc.name() == "sshd" or proc.exe() == SSHD
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at `path` (no passphrase); returns the public line's "type base64" part."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=20)
    kind, blob = path.with_suffix(".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _check_runnable() -> None:
    if not os.path.exists(SSHD):
        raise SshHostUnavailable(NOT_INSTALLED)
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise SshHostUnavailable(f"the OpenSSH client ({tool}) is not installed: apt-get install openssh-client")
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
        except OSError as e:
            raise SshHostUnavailable(f"sshd as root needs {PRIVSEP_DIR}, which could not be made: {e}") from None


def _sshd_config(d: Path, port: int, user: str, tag: str) -> str:
    bin_dir = Path(sys.prefix) / "bin"
    # HOME is the host's own: the login shell then reads no dotfiles of the real user's (root's .bashrc here puts
    # pyenv's shims before the venv), and what the remote servelab writes under ~ stays in the test's directory.
    session_env = [f"PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin", f"HOME={d / 'home'}", f"{TAG_ENV}={tag}"]
    if os.environ.get("SERVELAB_LOOPBACK_ONLY"):
        session_env.append(f"SERVELAB_LOOPBACK_ONLY={os.environ['SERVELAB_LOOPBACK_ONLY']}")
    return "\n".join([
        f"ListenAddress 127.0.0.1:{port}",
        "AddressFamily inet",
        f"HostKey {d / 'host_ed25519'}",
        f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The keys live under the test's tmp directory, below the world-writable /tmp that StrictModes refuses.
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel VERBOSE",
        # scp in OpenSSH >= 9.0 speaks sftp: the in-process server needs no separate binary.
        "Subsystem sftp internal-sftp",
        "SetEnv " + " ".join(session_env),
        "",
    ])


def _client_config(d: Path, port: int, user: str, known_hosts: Path) -> str:
    return "\n".join([
        f"Host {ALIAS} 127.0.0.1",
        "  HostName 127.0.0.1",
        f"  Port {port}",
        f"  User {user}",
        f"  IdentityFile {d / 'user_ed25519'}",
        "  IdentitiesOnly yes",
        "  IdentityAgent none",
        f"  UserKnownHostsFile {known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        "  PasswordAuthentication no",
        "  ConnectTimeout 5",
        "",
    ])


def start_ssh_host(directory: Path, *, known_hosts: str = "matching") -> SshHost:
    """A running sshd on 127.0.0.1 with its keys, configs and log in `directory`; accepting when it returns.
    Raises SshHostUnavailable when sshd cannot run here."""
    if known_hosts not in KNOWN_HOSTS_VARIANTS:
        raise ValueError(f"known_hosts must be one of {KNOWN_HOSTS_VARIANTS}, not {known_hosts!r}")
    _check_runnable()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    host_key = _keygen(d / "host_ed25519", "servelab-test-host")
    user_key = _keygen(d / "user_ed25519", "servelab-test-user")
    (d / "authorized_keys").write_text(user_key + "\n")
    (d / "home").mkdir(exist_ok=True)
    tag = uuid.uuid4().hex
    last_error = ""
    for _attempt in range(3):  # another process may take the free port between the probe and sshd's bind
        port = _free_port()
        sshd_config = d / "sshd_config"
        sshd_config.write_text(_sshd_config(d, port, user, tag))
        check = subprocess.run([SSHD, "-t", "-f", str(sshd_config)], capture_output=True, text=True, timeout=20)
        if check.returncode != 0:
            raise SshHostUnavailable(f"sshd refused its config: {check.stderr.strip() or check.stdout.strip()}")
        log_path = d / "sshd.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(sshd_config)], stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
        if _wait_accepting(process, port):
            break
        if process.poll() is None:
            process.kill()
        process.wait(timeout=5)
        last_error = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        last_error = last_error[0]
    else:
        raise SshHostUnavailable(f"sshd did not start on 127.0.0.1: {last_error} (log: {log_path})")

    known_hosts_path = d / "known_hosts"
    entry_host = f"[127.0.0.1]:{port}"
    if known_hosts == "matching":
        known_hosts_path.write_text(f"{entry_host} {host_key}\n")
    elif known_hosts == "changed":
        other_key = _keygen(d / "other_host_ed25519", "not-the-server")
        known_hosts_path.write_text(f"{entry_host} {other_key}\n")
    else:
        known_hosts_path.write_text("")
    config_path = d / "ssh_config"
    config_path.write_text(_client_config(d, port, user, known_hosts_path))
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID")}
    env["SERVELAB_SSH_CONFIG"] = str(config_path)
    return SshHost(alias=ALIAS, port=port, user=user, directory=d, config_path=config_path,
                   known_hosts_path=known_hosts_path, identity_path=d / "user_ed25519",
                   host_key_path=d / "host_ed25519", log_path=d / "sshd.log", remote_home=d / "home",
                   pid_path=d / "sshd.pid",
                   control_dir=Path(tempfile.mkdtemp(prefix="sl-ssh-", dir="/tmp")), tag=tag, process=process,
                   env=env)


def _wait_accepting(process: subprocess.Popen, port: int) -> bool:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def _fixture(tmp_path: Path, known_hosts: str):
    try:
        host = start_ssh_host(tmp_path / "sshd", known_hosts=known_hosts)
    except SshHostUnavailable as e:
        pytest.skip(str(e))
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def ssh_host(tmp_path):
    """A fresh sshd on 127.0.0.1 whose key is in the client config's known_hosts."""
    yield from _fixture(tmp_path, "matching")


@pytest.fixture
def ssh_host_changed_key(tmp_path):
    """A fresh sshd whose host key is not the one known_hosts holds for its address."""
    yield from _fixture(tmp_path, "changed")


@pytest.fixture
def ssh_host_unknown_key(tmp_path):
    """A fresh sshd whose host key known_hosts does not hold at all."""
    yield from _fixture(tmp_path, "unknown")

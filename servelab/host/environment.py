"""What the machine did while a load level ran, and whether it was quiet (docs/metrics.md#environment).

A level measured while some other process took a core is a measurement of the machine, not of the server. The
`EnvironmentSampler` looks at the host about every half second from a daemon thread while a bench runs and splits
the host's busy CPU time three ways: this servelab process (the client: its own headroom), the engine's process
tree, and everything else. The "everything else" share is not found by visiting every process each time (that
costs a core on a big host): it is the host's busy time from /proc/stat minus the client's and the engine's. Only
at a level's start and end does the sampler scan all processes, once each, to name the busiest other ones as
evidence. `contention_reasons` holds the rule that calls a level contended (docs/metrics.md#contended).

Everything here is best effort: a missing /proc, a process that vanishes, an unreadable socket table or an absent
NVIDIA driver leave a reading empty (None) instead of failing the benchmark.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import psutil

from servelab.host.gpus import Nvml
from servelab.records import EnvironmentSummary, TopProcess

# ---- the contention rule (docs/metrics.md#contended) ----
# Processes other than servelab and the engine used at least this many cores on average over the level.
OTHER_CORES_LIMIT = 0.25
# CPU steal (time the hypervisor ran someone else on this VM's CPUs) averaged at least this share of host CPU time.
STEAL_PCT_LIMIT = 5.0
# The client (this servelab process) was itself busy at least this many cores on average: the load generator, not
# the server, may have set the pace. Counted as contended: the level's figures then describe the client.
CLIENT_CORES_LIMIT = 0.9

# ---- sampling ----
DEFAULT_INTERVAL_S = 0.5
TREE_REFRESH_S = 2.0  # how often the engine's process tree is looked up again (children it spawned since)
HOST_LOAD_WINDOW_S = 0.3  # provenance: the look at the host's load at run start
TOP_OTHERS = 5  # the busiest other processes kept as evidence ...
TOP_OTHER_MIN_CORES = 0.02  # ... when they used at least this much over the level
REASON_OTHERS = 3  # how many of them a reason names
REASON_OTHER_MIN_CORES = 0.05
IN_PROCESS_NOTE = ("the server runs inside this servelab process: its CPU is counted as the client's, and the client "
                   "rule is not applied")
REASON_UNSEEN_MIN_CORES = 0.1  # other CPU that no visible process accounts for, named as such above this


# --------------------------------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------------------------------

def contention_reasons(*, other_cores: float | None, steal_pct: float | None, client_cores: float | None,
                       top_others: Sequence[TopProcess] = (), other_includes_engine: bool = False,
                       client_includes_engine: bool = False, client_processes: int = 1) -> list[str]:
    """Why a level was contended, one sentence per reason with its figures; empty when it was quiet.

    `other_cores`, `steal_pct` and `client_cores` are the level's means. When the engine runs on this host but its
    processes could not be found (`other_includes_engine`), "other" holds the engine's CPU too and the
    other-processes rule cannot be applied; when the server runs inside servelab's own process
    (`client_includes_engine`, a test's in-process server), the client's CPU is the server's too and the client rule
    cannot be applied. With worker processes (`client_processes` > 1: bench --workers) the client rule applies to
    their mean: a pool is saturated when its processes are, on average."""
    reasons: list[str] = []
    if other_cores is not None and other_cores >= OTHER_CORES_LIMIT and not other_includes_engine:
        named = [p for p in top_others if p.cores >= REASON_OTHER_MIN_CORES][:REASON_OTHERS]
        who = (", ".join(f"{p.name} pid {p.pid}: {p.cores:.2f}" for p in named) if named
               else "none visible to servelab")
        unseen = other_cores - sum(p.cores for p in top_others)
        if named and unseen >= REASON_UNSEEN_MIN_CORES:
            who += f"; {unseen:.2f} from no process visible at the level's end"
        if unseen >= REASON_UNSEEN_MIN_CORES:
            who += " (short-lived processes, or another container or VM)"
        reasons.append(f"other processes used {other_cores:.2f} cores on average ({who})")
    if steal_pct is not None and steal_pct >= STEAL_PCT_LIMIT:
        reasons.append(f"CPU steal averaged {steal_pct:.1f} % of host CPU time (the hypervisor ran something "
                       f"else on this machine's CPUs)")
    processes = max(client_processes, 1)
    if client_cores is not None and client_cores / processes >= CLIENT_CORES_LIMIT and not client_includes_engine:
        who = (f"{CLIENT_REASON} (this servelab process)" if processes == 1 else
               f"{CLIENT_REASON} ({processes} servelab processes, {client_cores / processes:.2f} cores each)")
        reasons.append(f"{who} used {client_cores:.2f} cores on average: the load "
                       f"generator, not the server, may have set the pace")
    return reasons


CLIENT_REASON = "the client"  # how the client rule's reason begins


def busy_machine(env: EnvironmentSummary) -> bool:
    """Whether the level was contended by the machine (other processes, CPU steal), not only by its own client:
    what waiting for a quiet machine can cure."""
    return any(not r.startswith(CLIENT_REASON) for r in env.reasons)


def contention_warning(env: EnvironmentSummary) -> str | None:
    """The level warning for a contended level, or None."""
    if not env.contended:
        return None
    return ("contended: the machine was not quiet during this level (" + "; ".join(env.reasons)
            + "): its figures may not show what the server can do")


# --------------------------------------------------------------------------------------------------------------
# Where the engine is
# --------------------------------------------------------------------------------------------------------------

def is_local_host(host: str | None) -> bool:
    """Whether `host` (a URL's host) is this machine: loopback, the unspecified address, one of this host's
    interface addresses, or its hostname. No DNS lookup (it could hang)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        # The hostname only: socket.getfqdn() is a reverse lookup (gethostbyaddr) that asks DNS, and can hang.
        try:
            names = {socket.gethostname().lower()}
        except OSError:
            names = set()
        return host in names or host.split(".")[0] in names and host.endswith((".local", ".localdomain"))
    if ip.is_loopback or ip.is_unspecified:
        return True
    try:
        addrs = {a.address.split("%")[0].lower() for nics in psutil.net_if_addrs().values() for a in nics}
    except (OSError, psutil.Error):
        return False
    return str(ip) in addrs


@dataclass(frozen=True)
class Listener:
    """Who listens on a local port: the pids psutil could see, and whether a listener's pid was hidden from us
    (another user's process, or not permitted to read the socket table)."""

    pids: tuple[int, ...] = ()
    hidden: bool = False


def listening_pids(port: int) -> Listener:
    """The processes listening on TCP `port` on this host."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError, OSError):
        return Listener(hidden=True)
    pids: set[int] = set()
    hidden = False
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                hidden = True
            else:
                pids.add(c.pid)
    return Listener(pids=tuple(sorted(pids)), hidden=hidden)


def url_port(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return parts.hostname, None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


# --------------------------------------------------------------------------------------------------------------
# Readings
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostTimes:
    """Cumulative host CPU time (ticks or seconds: only ratios are used), summed over all CPUs."""

    busy: float  # user + nice + system + irq + softirq (guest time is already inside user and nice)
    steal: float
    iowait: float
    total: float  # busy + idle + iowait + steal


@dataclass(frozen=True)
class Reading:
    """One look. CPU figures are cumulative; the rest is the value at the time of the look."""

    t: float  # time.monotonic()
    host: HostTimes | None
    cpus: int
    load1: float | None
    run_queue: int | None  # runnable tasks on the host, the looking thread excluded
    client_s: float  # this process's CPU seconds (all its threads)
    engine_s: float | None  # the engine tree's CPU seconds since the sampler began watching; None: no engine
    gpu_util: float | None  # mean over devices, percent
    gpu_clock: float | None  # mean SM clock over devices, MHz


def read_proc_stat() -> tuple[HostTimes | None, int, int | None]:
    """(host CPU times, online CPUs, procs_running) from /proc/stat; psutil's times where there is no /proc."""
    try:
        with open("/proc/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return _psutil_host_times(), os.cpu_count() or 1, None
    host: HostTimes | None = None
    cpus = 0
    running: int | None = None
    for line in data.split(b"\n"):
        if line.startswith(b"cpu "):
            v = [int(x) for x in line.split()[1:]] + [0] * 10
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            busy = user + nice + system + irq + softirq
            host = HostTimes(busy=busy, steal=steal, iowait=iowait, total=busy + idle + iowait + steal)
        elif line.startswith(b"cpu"):
            cpus += 1
        elif line.startswith(b"procs_running"):
            try:
                running = int(line.split()[1])
            except (IndexError, ValueError):
                pass
    return host, cpus or (os.cpu_count() or 1), running


def _psutil_host_times() -> HostTimes | None:
    try:
        t = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    get = lambda name: float(getattr(t, name, 0.0) or 0.0)  # noqa: E731
    busy = get("user") + get("nice") + get("system") + get("irq") + get("softirq")
    return HostTimes(busy=busy, steal=get("steal"), iowait=get("iowait"),
                     total=busy + get("idle") + get("iowait") + get("steal"))


def _proc_cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system  # its own threads; children are tracked (or not) on their own


@dataclass(frozen=True)
class _Seen:
    name: str
    cpu_s: float
    created: float


def _scan() -> tuple[dict[int, _Seen], dict[int, int]]:
    """Every visible process: pid -> (name, CPU seconds, create time), and pid -> parent pid."""
    seen: dict[int, _Seen] = {}
    parents: dict[int, int] = {}
    try:
        procs = list(psutil.process_iter(["name", "cpu_times", "create_time", "ppid"]))
    except (OSError, psutil.Error):
        return seen, parents
    for p in procs:
        info = p.info
        if info.get("ppid") is not None:
            parents[p.pid] = info["ppid"]
        ct = info.get("cpu_times")
        if ct is not None:
            seen[p.pid] = _Seen(name=info.get("name") or "?", cpu_s=ct.user + ct.system,
                                created=info.get("create_time") or 0.0)
    return seen, parents


# --------------------------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------------------------

class EnvironmentSampler:
    """Samples the host every `interval_s` from a daemon thread while a bench runs.

    `start_level()` marks a level's start, `end_level()` summarises the samples taken since (one is taken at each
    of the two calls, so a level shorter than the interval still has a reading), `close()` stops the thread. A
    context manager, sync or async. `engine_pids`: the engine's processes (their trees, children spawned later
    included, are the engine's); empty: the process listening on `url`'s port when `url` is on this host."""

    def __init__(self, engine_pids: Iterable[int] = (), *, url: str | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, tree_refresh_s: float = TREE_REFRESH_S,
                 gpu: bool = True, thread: bool = True) -> None:
        self.interval_s = interval_s
        self.tree_refresh_s = tree_refresh_s
        self._me = os.getpid()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._want_thread = thread
        self._since_wall = time.time()
        self.note: str | None = None
        self.other_includes_engine = False
        self.client_includes_engine = False
        # Worker processes of this bench on this host (bench --workers): their CPU is the client's.
        self._client_procs: dict[int, psutil.Process] = {}
        self._client_last: dict[int, float] = {}
        self._client_extra_s = 0.0
        roots = [p for p in dict.fromkeys(int(p) for p in engine_pids)]
        if not roots and url:
            roots = self._engine_from_url(url)
        if self._me in roots:
            roots.remove(self._me)
            self.note = IN_PROCESS_NOTE
            self.client_includes_engine = True
        self.engine_roots: list[int] = roots
        self._members: dict[int, psutil.Process] = {}
        self._last_cpu: dict[int, float | None] = {}
        self._engine_total = 0.0
        self._last_refresh = 0.0
        self._gpus = Nvml(gpu)
        self._level: list[Reading] = []
        self._level_wall = time.time()
        self._level_scan: dict[int, _Seen] = {}
        if self.engine_roots:
            self._refresh_tree(_scan()[1])
        self._level = [self._read()]

    # ---- where the engine is ----
    def _engine_from_url(self, url: str) -> list[int]:
        host, port = url_port(url)
        if port is None or not is_local_host(host):
            return []  # the server is elsewhere: everything busy here besides the client is "other"
        listener = listening_pids(port)
        if self._me in listener.pids:
            self.note = IN_PROCESS_NOTE
            self.client_includes_engine = True
            return [p for p in listener.pids if p != self._me]
        if not listener.pids:
            self.other_includes_engine = True
            self.note = (f"the server on port {port} runs on this host but its process could not be seen (another "
                         f"user's or a container's): its CPU is counted in other_cpu, and the other-processes "
                         f"rule is not applied")
        return list(listener.pids)

    def _refresh_tree(self, parents: dict[int, int]) -> None:
        """Add the engine's descendants (spawned since the last look) to the watched members; drop the dead."""
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)
        todo = [p for p in (*self.engine_roots, *self._members) if p in parents or p in self._members]
        found: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in found or pid == self._me:
                continue
            found.add(pid)
            todo.extend(children.get(pid, ()))
        for pid in found - set(self._members):
            try:
                proc = psutil.Process(pid)
                created = proc.create_time()
            except (psutil.Error, OSError):
                continue
            self._members[pid] = proc
            # Born while watched: all its CPU is the engine's and falls in the watched time; else start from now.
            self._last_cpu[pid] = 0.0 if created >= self._since_wall else None
        for pid, proc in list(self._members.items()):
            if pid not in found and not proc.is_running():
                self._drop(pid)
        self._last_refresh = time.monotonic()

    def add_client_pids(self, pids: Iterable[int]) -> None:
        """These processes are part of the client (bench --workers): their CPU counts as the client's, from now."""
        with self._lock:
            for pid in pids:
                if pid == self._me or pid in self._client_procs:
                    continue
                try:
                    proc = psutil.Process(pid)
                    self._client_last[pid] = _proc_cpu(proc)
                except (psutil.Error, OSError):
                    continue
                self._client_procs[pid] = proc

    @property
    def client_processes(self) -> int:
        return 1 + len(self._client_procs)

    def _client_cpu(self) -> float:
        """This process's CPU seconds, plus what its worker processes used since they were added (a worker that
        exited keeps what was read of it)."""
        for pid, proc in list(self._client_procs.items()):
            try:
                now = _proc_cpu(proc)
            except (psutil.Error, OSError):
                continue
            self._client_extra_s += max(0.0, now - self._client_last.get(pid, now))
            self._client_last[pid] = now
        return time.process_time() + self._client_extra_s

    def _drop(self, pid: int) -> None:
        self._members.pop(pid, None)
        self._last_cpu.pop(pid, None)

    def _engine_cpu(self) -> float | None:
        if not self.engine_roots:
            return None
        for pid, proc in list(self._members.items()):
            try:
                now = _proc_cpu(proc)
            except psutil.AccessDenied:
                continue
            except (psutil.NoSuchProcess, OSError):
                self._drop(pid)  # its CPU since the last look is lost (docs/metrics.md#environment)
                continue
            prev = self._last_cpu.get(pid)
            if prev is not None:
                self._engine_total += max(0.0, now - prev)
            self._last_cpu[pid] = now
        return self._engine_total

    # ---- one look ----
    def _read(self) -> Reading:
        host, cpus, running = read_proc_stat()
        try:
            load1: float | None = os.getloadavg()[0]
        except (OSError, AttributeError):
            load1 = None
        util, clock = self._gpus.mean_utilization_and_clock()
        return Reading(t=time.monotonic(), host=host, cpus=cpus, load1=load1,
                       run_queue=max(0, running - 1) if running is not None else None,  # minus the looker
                       client_s=self._client_cpu(), engine_s=self._engine_cpu(), gpu_util=util, gpu_clock=clock)

    def sample(self) -> Reading:
        """Take one reading now (the thread calls this; so do start_level and end_level)."""
        with self._lock:
            if self.engine_roots and time.monotonic() - self._last_refresh >= self.tree_refresh_s:
                self._refresh_tree(_scan_parents())
            reading = self._read()
            self._level.append(reading)
            return reading

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # never let a reading kill the thread (nor the bench)
                pass

    # ---- the API ----
    def start(self) -> EnvironmentSampler:
        if self._want_thread and self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="servelab-environment", daemon=True)
            self._thread.start()
        return self

    def start_level(self) -> None:
        """A level starts now: forget the samples before it, and note every process's CPU for the evidence."""
        seen, parents = _scan()
        with self._lock:
            if self.engine_roots:
                self._refresh_tree(parents)
            self._level = []
            self._level_wall = time.time()
            self._level_scan = seen
        self.sample()

    def end_level(self) -> EnvironmentSummary:
        """The level ends now: summarise it (with the busiest other processes over it)."""
        seen, parents = _scan()
        with self._lock:
            if self.engine_roots:
                self._refresh_tree(parents)
        last = self.sample()
        with self._lock:
            readings = list(self._level)
            top = self._top_others(seen, max(readings[-1].t - readings[0].t, 1e-9) if len(readings) > 1
                                   else None)
            self._level = [last]  # the next level (or a call without start_level) starts here
            self._level_wall = time.time()
            self._level_scan = seen
        return summarize_readings(readings, interval_s=self.interval_s, top_others=top,
                                  engine_pids=self.engine_roots, note=self.note,
                                  other_includes_engine=self.other_includes_engine,
                                  client_includes_engine=self.client_includes_engine,
                                  client_processes=self.client_processes)

    def level_so_far(self) -> EnvironmentSummary:
        """The level in progress as it stands (nothing is reset), judged by the rules a retry can cure: other
        processes and CPU steal. The client rule is left out: a saturated client stays saturated when the trial
        runs again. No process scan (cheap enough to call every second), so no processes are named."""
        with self._lock:
            readings = list(self._level)
        return summarize_readings(readings, interval_s=self.interval_s, engine_pids=self.engine_roots,
                                  note=self.note, other_includes_engine=self.other_includes_engine,
                                  client_includes_engine=True)

    def _top_others(self, seen: dict[int, _Seen], duration_s: float | None) -> list[TopProcess]:
        if not duration_s or not self._level_scan:
            return []
        mine = {self._me, *self._members, *self.engine_roots, *self._client_procs}
        out: list[TopProcess] = []
        for pid, now in seen.items():
            if pid in mine:
                continue
            before = self._level_scan.get(pid)
            if before is not None and before.created == now.created:
                used = now.cpu_s - before.cpu_s
            elif now.created >= self._level_wall - 0.05:
                used = now.cpu_s  # born during the level
            else:
                continue
            cores = used / duration_s
            if cores >= TOP_OTHER_MIN_CORES:
                out.append(TopProcess(pid=pid, name=now.name, cores=round(cores, 3)))
        out.sort(key=lambda p: -p.cores)
        return out[:TOP_OTHERS]

    def close(self) -> None:
        """Stop the thread (the samples stay: end_level still works, without GPU readings)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.interval_s))
            self._thread = None
        with self._lock:
            self._gpus.close()

    def __enter__(self) -> EnvironmentSampler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> EnvironmentSampler:
        return self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()


def _scan_parents() -> dict[int, int]:
    """pid -> parent pid of every process (cheaper than _scan: no names, no CPU times)."""
    try:
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info.get("ppid") is not None}
    except (OSError, psutil.Error):
        return {}


# --------------------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------------------

def summarize_readings(readings: Sequence[Reading], *, interval_s: float | None = None,
                       top_others: Sequence[TopProcess] = (), engine_pids: Sequence[int] = (),
                       note: str | None = None, other_includes_engine: bool = False,
                       client_includes_engine: bool = False, client_processes: int = 1) -> EnvironmentSummary:
    """A level's EnvironmentSummary from its readings (definitions: docs/metrics.md#environment). Means are
    over the whole span (totals ÷ time), maxima over the intervals between consecutive readings."""
    env = EnvironmentSummary(samples=len(readings), interval_s=interval_s, top_others=list(top_others),
                             engine_pids=list(engine_pids), note=note)
    if not readings:
        return env
    first, last = readings[0], readings[-1]
    env.host_cpus = last.cpus
    env.duration_s = round(last.t - first.t, 3)
    env.load1_mean, env.load1_max = _mean_max([r.load1 for r in readings])
    env.run_queue_mean, env.run_queue_max = _mean_max([r.run_queue for r in readings])
    env.gpu_util_pct_mean = _mean_max([r.gpu_util for r in readings])[0]
    env.gpu_clock_mhz_mean = _mean_max([r.gpu_clock for r in readings])[0]
    pairs = list(zip(readings, readings[1:]))
    if pairs and last.t > first.t:
        dt = last.t - first.t
        busy = _host_share(first, last, "busy")
        client = (last.client_s - first.client_s) / dt
        engine = ((last.engine_s - first.engine_s) / dt if last.engine_s is not None and first.engine_s is not None
                  else None)
        env.client_cpu_cores_mean = _r(client)
        env.engine_cpu_cores_mean = _r(engine)
        if busy is not None:
            env.host_busy_cores_mean = _r(busy * last.cpus)
            env.other_cpu_cores_mean = _r(max(0.0, busy * last.cpus - client - (engine or 0.0)))
        steal, iowait = _host_share(first, last, "steal"), _host_share(first, last, "iowait")
        env.steal_pct = _r(steal * 100 if steal is not None else None, 2)
        env.iowait_pct = _r(iowait * 100 if iowait is not None else None, 2)
        clients, engines, others = [], [], []
        for a, b in pairs:
            step = b.t - a.t
            if step <= 0:
                continue
            c = (b.client_s - a.client_s) / step
            e = (b.engine_s - a.engine_s) / step if a.engine_s is not None and b.engine_s is not None else None
            clients.append(c)
            if e is not None:
                engines.append(e)
            share = _host_share(a, b, "busy")
            if share is not None:
                others.append(max(0.0, share * b.cpus - c - (e or 0.0)))
        env.client_cpu_cores_max = _r(max(clients, default=None))
        env.engine_cpu_cores_max = _r(max(engines, default=None))
        env.other_cpu_cores_max = _r(max(others, default=None))
    env.reasons = contention_reasons(other_cores=env.other_cpu_cores_mean, steal_pct=env.steal_pct,
                                     client_cores=env.client_cpu_cores_mean, top_others=env.top_others,
                                     other_includes_engine=other_includes_engine,
                                     client_includes_engine=client_includes_engine,
                                     client_processes=client_processes)
    env.contended = bool(env.reasons)
    return env


def _host_share(a: Reading, b: Reading, what: str) -> float | None:
    """The share of host CPU time between two readings that was `what` (busy, steal, iowait)."""
    if a.host is None or b.host is None:
        return None
    total = b.host.total - a.host.total
    if total <= 0:
        return None
    return max(0.0, getattr(b.host, what) - getattr(a.host, what)) / total


def _mean_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return _r(sum(vals) / len(vals)), _r(max(vals))


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------------------------------------------
# Provenance: one short look at run start
# --------------------------------------------------------------------------------------------------------------

def host_load(engine_pids: Iterable[int] = (), window_s: float = HOST_LOAD_WINDOW_S) -> EnvironmentSummary | None:
    """How busy the host was over a short look (`window_s`), by the same definitions as a level's environment.
    None if it could not be measured."""
    try:
        sampler = EnvironmentSampler(engine_pids, thread=False, gpu=False, interval_s=window_s)
        sampler.start_level()
        time.sleep(window_s)
        env = sampler.end_level()
        sampler.close()
        return env
    except Exception:
        return None

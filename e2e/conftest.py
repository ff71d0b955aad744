"""The end-to-end harness: a real cluster (kubectl, helm), the chart, the operator as a local
process with the chart's ServiceAccount token, an embedded PostgreSQL, Prometheus, and workers.

Run it with `e2e/run.sh` (which provides the cluster, or uses $KUBECONFIG). Session fixtures start
each piece once, in dependency order, and stop it at the end; every process started here is
recorded in $VENTURI_E2E_PIDFILE (name, PID, start time, signal) so that run.sh can stop it by
PID even if pytest itself dies. Every listener binds to 127.0.0.1.

Nothing here sleeps blindly: `wait_until` polls a condition with a deadline and reports the last
value it saw when the deadline passes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from venturi import PostgresStore, Queue, Stats
from venturi.embedded import EmbeddedPostgres

T = TypeVar("T")
Object = dict[str, Any]

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "e2e"
CHART = ROOT / "charts" / "venturi"

RELEASE = "venturi"
OPERATOR_NS = "venturi-system"
APPS_NS = "e2e-apps"
PREFIX = "e2e"
"""The queue's table prefix (VENTURI_PREFIX of the workers, spec.database.prefix)."""
SECRET = "e2e-db"
"""The Secret with the queue's DSN."""
MISSING_SECRET = "e2e-db-missing"
"""A Secret the operator is given (rbac.secretNames) that does not exist."""

MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
SCRAPE_INTERVAL = 1.0
"""Prometheus' scrape and rule evaluation interval, in seconds."""


# --------------------------------------------------------------------------- interrupts


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session: pytest.Session) -> None:
    # run.sh stops an interrupted run with SIGTERM: tear the fixtures down as on Ctrl-C, so
    # that every process started here is stopped and every object deleted.
    signal.signal(signal.SIGTERM, _interrupt)


# --------------------------------------------------------------------------- waiting


class Abort(Exception):
    """Raised by a `wait_until` condition that can never hold any more (a process died)."""


def abort_unless(ok: bool, message: Callable[[], str]) -> None:
    if not ok:
        raise Abort(message())


def wait_until(
    what: str, condition: Callable[[], T | None], timeout: float, interval: float = 0.5
) -> T:
    """Poll `condition` until it returns something truthy; fail with the last value after
    `timeout` seconds. Exceptions count as "not yet" (and are reported if it never holds),
    except `Abort`, which fails at once."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except Abort:
            raise
        except Exception as exc:  # e.g. a 404 while an object is being created
            value, last = None, exc
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f}s (last: {last!r})")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


# --------------------------------------------------------------------------- processes


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (None once the process is gone or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Processes:
    """Starts processes in their own sessions, logs each to a file, records each PID."""

    logdir: Path
    pidfile: Path | None
    started: list[Proc] = field(default_factory=list)

    def record(self, name: str, pid: int, sig: signal.Signals) -> None:
        if self.pidfile is None:
            return
        start = _start_time(pid)
        if start is not None:
            with self.pidfile.open("a") as f:
                f.write(f"{name} {pid} {start} {sig.name}\n")

    def start(
        self, name: str, args: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Proc:
        log = self.logdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.started.append(proc)
        self.record(name, popen.pid, signal.SIGTERM)
        return proc

    def stop(self, proc: Proc, *, sig: signal.Signals = signal.SIGTERM, timeout: float = 20) -> int:
        """Signal the process, wait for it (SIGKILL after `timeout`); its exit status."""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
        return int(proc.popen.returncode)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            self.stop(proc)


def listeners(pids: set[int]) -> list[tuple[str, int, str]]:
    """TCP listening sockets of these PIDs: (local address, pid, process name), from `ss`."""
    out = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+),', fields[5]):
            if int(pid) in pids:
                found.append((fields[3], int(pid), name))
    return found


def cluster_pids() -> set[int]:
    """The control plane's PIDs when run.sh started it (cluster.sh's pids file)."""
    run = os.environ.get("VENTURI_E2E_RUN")
    if os.environ.get("VENTURI_E2E_CLUSTER_OWNED") != "1" or not run:
        return set()
    path = Path(run) / "pids"
    if not path.exists():
        return set()
    return {int(line.split()[1]) for line in path.read_text().splitlines() if line.strip()}


# --------------------------------------------------------------------------- kubectl / helm


class CommandError(AssertionError):
    pass


@dataclass(frozen=True)
class Kubectl:
    binary: str
    kubeconfig: str

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
        kubeconfig: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return _run_tool(
            "kubectl",
            [self.binary, f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            check=check,
            timeout=timeout,
        )

    def json(self, *args: str, kubeconfig: str | None = None) -> Object:
        data: Object = json.loads(self.run(*args, "-o", "json", kubeconfig=kubeconfig).stdout)
        return data

    def get(self, kind: str, name: str, namespace: str | None = None) -> Object:
        ns = ["-n", namespace] if namespace else []
        return self.json("get", kind, name, *ns)

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        ns = ["-n", namespace] if namespace else []
        result = self.run("get", kind, name, *ns, "--ignore-not-found", "-o", "name", check=False)
        return result.returncode == 0 and bool(result.stdout.strip())

    def apply(self, *docs: Object, check: bool = True) -> subprocess.CompletedProcess[str]:
        text = "\n---\n".join(yaml.safe_dump(d) for d in docs)
        return self.run("apply", "-f", "-", input=text, check=check)


@dataclass(frozen=True)
class Helm:
    binary: str
    kubeconfig: str

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run_tool(
            "helm", [self.binary, f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout
        )


def _run_tool(
    name: str,
    argv: list[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl or helm; with `check`, a failure raises with the tool's own output."""
    result = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise CommandError(
            f"{name} {' '.join(argv[2:])} failed ({result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )
    return result


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            found: Mapping[str, Any] = c
            return found
    return None


# --------------------------------------------------------------------------- the database


class Db:
    """The queue's database from the tests' side: the venturi Python API on an event loop of
    its own (a thread), so that synchronous tests can enqueue and read stats."""

    def __init__(self, dsn: str, prefix: str) -> None:
        self.dsn = dsn
        self.prefix = prefix
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.store: PostgresStore = self.call(PostgresStore.connect(dsn, prefix=prefix, max_size=2))
        self.queue = Queue(self.store)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stats(self) -> Stats:
        return self.call(self.queue.stats())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self.store.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# --------------------------------------------------------------------------- Prometheus


@dataclass(frozen=True)
class Prometheus:
    url: str
    proc: Proc
    started_at: float
    rules_file: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=30)
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: HTTP {status}: {body[:2000]}")
        return data["data"]

    def query(self, expr: str) -> list[Object]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[Object] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float | None = None) -> list[Object]:
        """Like a Grafana time-series panel: the expression over [start, end], 1 s steps."""
        data = self.api(
            "query_range",
            query=expr,
            start=f"{start:.3f}",
            end=f"{end if end is not None else time.time():.3f}",
            step="1",
        )
        assert data["resultType"] == "matrix", (expr, data["resultType"])
        result: list[Object] = data["result"]
        return result


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Ports:
    operator_metrics: int
    operator_health: int
    prometheus: int
    workers: tuple[int, ...]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if env := os.environ.get("VENTURI_E2E_WORKDIR"):
        path = Path(env) / "session"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("venturi-e2e")


@pytest.fixture(scope="session")
def processes(workdir: Path) -> Iterator[Processes]:
    logdir = workdir / "log"
    logdir.mkdir(exist_ok=True)
    pidfile = os.environ.get("VENTURI_E2E_PIDFILE")
    procs = Processes(logdir, Path(pidfile) if pidfile else None)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="session")
def ports() -> Ports:
    return Ports(
        operator_metrics=free_port(),
        operator_health=free_port(),
        prometheus=free_port(),
        workers=(free_port(), free_port()),
    )


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.fail("KUBECONFIG is not set: run the suite with e2e/run.sh")
    binary = os.environ.get("VENTURI_E2E_KUBECTL") or shutil.which("kubectl")
    if not binary:
        pytest.fail("no kubectl (VENTURI_E2E_KUBECTL or PATH)")
    return Kubectl(binary, kubeconfig)


@pytest.fixture(scope="session")
def helm(kubectl: Kubectl) -> Helm:
    binary = os.environ.get("VENTURI_E2E_HELM") or shutil.which("helm")
    if not binary:
        pytest.fail("no helm (VENTURI_E2E_HELM or PATH)")
    return Helm(binary, kubectl.kubeconfig)


@pytest.fixture(scope="session")
def cluster_owned() -> bool:
    """True when run.sh started the cluster for this run (and deletes it afterwards)."""
    return os.environ.get("VENTURI_E2E_CLUSTER_OWNED") == "1"


@pytest.fixture(scope="session")
def monitoring_crds(kubectl: Kubectl) -> list[str]:
    """The pinned monitoring.coreos.com CRDs, applied unless the cluster already has them (a
    real Prometheus Operator's CRDs are never replaced)."""
    source = os.environ.get("VENTURI_E2E_MONITORING_CRDS")
    if not source:
        pytest.fail("VENTURI_E2E_MONITORING_CRDS is not set: run the suite with e2e/run.sh")
    names = []
    for crd in MONITORING_CRDS:
        name = f"{crd}.monitoring.coreos.com"
        names.append(name)
        if not kubectl.exists("crd", name):
            path = Path(source) / f"monitoring.coreos.com_{crd}.yaml"
            kubectl.run("apply", "--server-side", "--field-manager=venturi-e2e", "-f", str(path))
    for name in names:
        kubectl.run("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return names


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    fullname: str
    service_account: str


@pytest.fixture(scope="session")
def release(
    kubectl: Kubectl, helm: Helm, monitoring_crds: list[str], cluster_owned: bool
) -> Iterator[Release]:
    """`helm install --wait` of the chart with monitoring on, and the values every install
    must give: the namespace to watch (APPS_NS) and the Secrets the operator may read."""
    for ns in (APPS_NS, OPERATOR_NS):
        if kubectl.exists("namespace", ns):
            pytest.fail(f"namespace {ns} already exists: a previous run did not clean up")
    kubectl.run("create", "namespace", APPS_NS)
    helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        OPERATOR_NS,
        "--create-namespace",
        "--set",
        f"operator.watchNamespaces={{{APPS_NS}}}",
        "--set",
        f"rbac.secretNames={{{SECRET},{MISSING_SECRET}}}",
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.grafanaDashboards.enabled=true",
        "--wait",
        "--timeout",
        "180s",
    )
    deployment = kubectl.get("deployment", RELEASE, OPERATOR_NS)
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    try:
        yield Release(RELEASE, OPERATOR_NS, RELEASE, sa)
    finally:
        if not cluster_owned:  # a cluster of run.sh's own is deleted as a whole
            with contextlib.suppress(CommandError):
                helm.run("uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait")
            kubectl.run(
                "delete",
                "namespace",
                APPS_NS,
                OPERATOR_NS,
                "--ignore-not-found",
                "--timeout=120s",
                check=False,
                timeout=150,
            )


@pytest.fixture(scope="session")
def sa_kubeconfig(kubectl: Kubectl, release: Release, workdir: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a TokenRequest token), for
    the same API server as $KUBECONFIG: the operator gets exactly the chart's RBAC."""
    token = kubectl.run(
        "create", "token", release.service_account, "-n", release.namespace, "--duration=2h"
    ).stdout.strip()
    view = kubectl.json("config", "view", "--raw", "--minify", "--flatten")
    cluster = view["clusters"][0]["cluster"]
    kept = {
        k: cluster[k]
        for k in (
            "server",
            "certificate-authority-data",
            "insecure-skip-tls-verify",
            "tls-server-name",
            "proxy-url",
        )
        if k in cluster
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": kept}],
        "users": [{"name": release.service_account, "user": {"token": token}}],
        "contexts": [
            {
                "name": "e2e",
                "context": {
                    "cluster": "e2e",
                    "user": release.service_account,
                    "namespace": APPS_NS,
                },
            }
        ],
        "current-context": "e2e",
    }
    path = workdir / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def postgres(processes: Processes) -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as pg:
        assert pg.pid is not None
        processes.record("postgres", pg.pid, signal.SIGINT)  # SIGINT: fast shutdown
        yield pg


def venturi_bin(name: str) -> str:
    """The venturi console scripts of the Python running the tests."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"no {name} command: install venturi[operator] (pip install -e '.[operator]')")
    return found


def worker_env(dsn: str, metrics_port: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env |= {"VENTURI_DSN": dsn, "VENTURI_PREFIX": PREFIX, "E2E_WORKER_CONCURRENCY": "2"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if metrics_port is not None:
        env["E2E_WORKER_METRICS_PORT"] = str(metrics_port)
    return env


@pytest.fixture(scope="session")
def migrated(postgres: EmbeddedPostgres) -> str:
    """`venturi migrate` on the embedded server; its DSN."""
    result = subprocess.run(
        [venturi_bin("venturi"), "migrate"],
        env=worker_env(postgres.dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "applied migrations" in result.stdout, result.stdout
    return postgres.dsn


@pytest.fixture(scope="session")
def db(migrated: str) -> Iterator[Db]:
    database = Db(migrated, PREFIX)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture(scope="session")
def prometheus(
    processes: Processes, ports: Ports, kubectl: Kubectl, release: Release, workdir: Path
) -> Iterator[Prometheus]:
    """Debian's Prometheus with its own config and data dir. It scrapes the local operator and
    workers through static configs (the chart's ServiceMonitor needs the Prometheus Operator,
    which is not installed), adding the target labels a ServiceMonitor/PodMonitor would, and
    loads the alert rules of the PrometheusRule the chart created (read back from the API)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus binary (Debian: apt-get install prometheus)")
    home = workdir / "prometheus"
    (home / "data").mkdir(parents=True, exist_ok=True)
    rule = kubectl.get("prometheusrule", release.fullname, release.namespace)
    rules_file = home / "venturi-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    template = string.Template((E2E / "prometheus" / "prometheus.yml").read_text())
    config = template.substitute(
        SCRAPE_INTERVAL=f"{SCRAPE_INTERVAL:g}s",
        RULES_FILE=str(rules_file),
        OPERATOR_TARGET=f"127.0.0.1:{ports.operator_metrics}",
        OPERATOR_NAMESPACE=release.namespace,
        WORKER_TARGETS=json.dumps([f"127.0.0.1:{p}" for p in ports.workers]),
        APPS_NAMESPACE=APPS_NS,
    )
    (home / "prometheus.yml").write_text(config)
    url = f"http://127.0.0.1:{ports.prometheus}"
    proc = processes.start(
        "prometheus",
        [
            binary,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{ports.prometheus}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ],
    )
    started = time.time()

    def ready() -> bool:
        abort_unless(proc.alive(), lambda: f"prometheus exited:\n{proc.tail()}")
        return http_get(f"{url}/-/ready")[0] == 200

    wait_until("Prometheus ready", ready, timeout=60)
    try:
        yield Prometheus(url, proc, started, rules_file)
    finally:
        rc = processes.stop(proc)
        assert rc == 0, f"prometheus exited {rc} on SIGTERM:\n{proc.tail()}"


@dataclass(frozen=True)
class Operator:
    proc: Proc
    metrics_url: str
    health_url: str

    def metrics(self) -> str:
        status, body = http_get(self.metrics_url)
        assert status == 200, (status, body[:500])
        return body


@pytest.fixture(scope="session")
def operator(
    processes: Processes,
    ports: Ports,
    sa_kubeconfig: Path,
    prometheus: Prometheus,  # first, so that it scrapes the operator from its first tick
    postgres: EmbeddedPostgres,  # first, so that the database outlives the operator
    kubectl: Kubectl,
    release: Release,
    cluster_owned: bool,
) -> Iterator[Operator]:
    """`venturi-operator` as a local process, authenticated as the chart's ServiceAccount."""
    if not cluster_owned:
        # On a cluster with real nodes the chart's own operator pod may really run: two
        # operators must never scale the same Deployments (this one would wait for its Lease).
        kubectl.run(
            "scale", "deployment", release.fullname, "-n", release.namespace, "--replicas=0"
        )
        kubectl.run(
            "wait",
            "--for=delete",
            "pod",
            "-n",
            release.namespace,
            "--timeout=120s",
            "-l",
            f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator",
            check=False,
            timeout=150,
        )
    env = dict(os.environ)
    env["KUBECONFIG"] = str(sa_kubeconfig)
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):  # never in-cluster config
        env.pop(var, None)
    proc = processes.start(
        "operator",
        [
            venturi_bin("venturi-operator"),
            "--namespace",
            APPS_NS,
            "--metrics-port",
            str(ports.operator_metrics),
            "--metrics-host",
            "127.0.0.1",
            "--liveness",
            f"http://127.0.0.1:{ports.operator_health}/healthz",
            "--log-level",
            "info",
            # As the chart runs it: elected through the chart's Lease, with the chart's RBAC.
            "--leader-elect",
            "--leader-election-namespace",
            release.namespace,
            "--leader-election-name",
            release.fullname,
        ],
        env=env,
    )
    op = Operator(
        proc,
        f"http://127.0.0.1:{ports.operator_metrics}/metrics",
        f"http://127.0.0.1:{ports.operator_health}/healthz",
    )

    def healthy() -> bool:
        abort_unless(
            proc.alive(),
            lambda: f"venturi-operator exited ({proc.popen.returncode}):\n{proc.tail()}",
        )
        if http_get(op.health_url)[0] != 200:
            return False
        status, body = http_get(op.metrics_url)
        # A follower answers /healthz too: the operator acts once it leads.
        return status == 200 and "venturi_operator_leader 1.0" in body

    wait_until("operator /healthz and /metrics answer, and it leads", healthy, timeout=60)
    try:
        yield op
    finally:
        rc = processes.stop(proc)
        print(f"\n--- operator log (exit {rc}), last lines:\n{proc.tail(30)}")
        assert rc == 0, f"venturi-operator exited {rc} on SIGTERM (20 s allowed)"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()

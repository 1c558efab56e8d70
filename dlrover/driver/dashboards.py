"""The Grafana dashboard and Prometheus config in ``dashboards/``, checked against real data.

``dlrover dashboards check`` (``make dashboards-check``; ``tests/test_observability.py``
runs the same steps) starts a Ray head on loopback and a real Prometheus with
``dashboards/prometheus.yml``, submits ``jobs/observe.yaml`` (a scale-out and a worker
kill) through Ray Jobs, and then asks Prometheus every query of
``dashboards/dlrover.json`` -- panels, annotations and the ``job_id`` variable -- over
the job's time range, as Grafana would. A query that returns no series fails the check.

``dlrover dashboards install`` puts the dashboard next to the ones Ray generates for its
session (``<session>/metrics/grafana/dashboards``), which Ray's own Grafana provisioning
(``<session>/metrics/grafana/grafana.ini``) loads.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import yaml

from dlrover.errors import DLRoverError

if TYPE_CHECKING:
    from dlrover.driver.localhead import LocalHead
    from dlrover.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "dlrover.json"
PROMETHEUS_YML = ROOT / "dashboards" / "prometheus.yml"
CHECK_JOB = "jobs/observe.yaml"
RAY_SD_FILE = "prom_metrics_service_discovery.json"  # Ray writes it in its temp dir
READY_TIMEOUT_S = 60.0
JOB_TIMEOUT_S = 600.0  # the check job takes about a minute; a hung one fails the check
# Grafana's own variables, as Grafana would fill them for a short time range.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "5m"}


@dataclass(frozen=True)
class Query:
    where: str  # "panel: Throughput", "annotation: Failures", "variable: job_id"
    expr: str


def load_dashboard(path: Path = DASHBOARD) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DLRoverError(f"{path}: not a readable dashboard JSON ({e})") from None


def dashboard_queries(dash: dict) -> list[Query]:
    """Every PromQL query of the dashboard: panel targets and annotations."""
    out = []
    for panel in dash.get("panels", []):
        for t in panel.get("targets", []):
            out.append(Query(f"panel: {panel['title']}", t["expr"]))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(Query(f"annotation: {a['name']}", a["expr"]))
    return out


def variable_query(dash: dict, name: str = "job_id") -> str:
    """The ``label_values(metric, label)`` query of a dashboard variable."""
    for v in dash.get("templating", {}).get("list", []):
        if v.get("name") == name:
            q = v.get("query")
            return q["query"] if isinstance(q, dict) else q
    raise DLRoverError(f"the dashboard has no {name!r} variable")


def render(expr: str, job_id: str) -> str:
    """The query as Grafana sends it with ``$job_id`` set to one job."""
    # Regex metacharacters escaped for a PromQL string (a literal backslash is written \\).
    expr = expr.replace("$job_id", re.sub(r"([.+*?()\[\]{}|^$\\])", r"\\\\\1", job_id))
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bray_dlrover_\w+", expr))


def prometheus_config(sd_file: Path, scrape_interval_s: float = 1.0) -> dict:
    """``dashboards/prometheus.yml`` with its discovery file pointed at ``sd_file``."""
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = f"{scrape_interval_s:g}s"
    for sc in cfg["scrape_configs"]:
        for sd in sc.get("file_sd_configs", []):
            sd["files"] = [str(sd_file)]
            sd["refresh_interval"] = f"{scrape_interval_s:g}s"
    return cfg


def loopback_targets(ray_temp_dir: str, out: Path, node_port: int, timeout_s: float = 60.0) -> Path:
    """Ray's discovery file with every target on 127.0.0.1 (Ray lists the host's address;
    the metrics endpoints listen on all interfaces, and checks stay on loopback). Waits until
    it lists the node's metrics endpoint (``node_port``): Ray adds that one after the
    dashboard's own."""
    src = Path(ray_temp_dir) / RAY_SD_FILE
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            groups = json.loads(src.read_text())
        except (OSError, ValueError):
            groups = []
        ports = [t.rsplit(":", 1)[1] for g in groups for t in g["targets"]]
        if str(node_port) in ports:
            break
        if time.monotonic() > deadline:
            raise DLRoverError(f"{src}: Ray listed no metrics endpoint on port {node_port} in {timeout_s:.0f}s (listed: {ports})")
        time.sleep(0.5)
    for g in groups:
        g["targets"] = ["127.0.0.1:" + t.rsplit(":", 1)[1] for t in g["targets"]]
    out.write_text(json.dumps(groups))
    return out


class Prometheus:
    """A Prometheus server on a free loopback port with its own config and storage."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.dir = ""
        self.url = ""

    def __enter__(self) -> "Prometheus":
        from dlrover.driver.localhead import free_port

        binary = shutil.which("prometheus")
        if binary is None:
            raise DLRoverError("prometheus not found on PATH (Debian: apt-get install prometheus)")
        self.dir = tempfile.mkdtemp(prefix="dlrover-prometheus-")
        cfg = Path(self.dir) / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        try:
            with open(Path(self.dir) / "prometheus.log", "w") as log:
                self.proc = subprocess.Popen(
                    [binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir}/data", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                    stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                )
            self._wait_ready()
        except BaseException:  # a bad config, a timeout, Ctrl-C: no server or directory left behind
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        from dlrover.driver.localhead import wait_until

        def failed(why: str) -> str:
            log = (Path(self.dir) / "prometheus.log").read_text()[-500:].strip()
            return f"prometheus {why}: {log.splitlines()[-1] if log else 'no log'}"

        def ready() -> bool:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200

        wait_until(ready, self.proc, READY_TIMEOUT_S, failed)

    def api(self, path: str, **params: str) -> object:
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # a bad query: Prometheus says why in the body
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise DLRoverError(f"prometheus {path} {params.get('query', '')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s:g}")["result"]

    def label_values(self, query: str, start: float, end: float) -> list[str]:
        """``label_values(metric, label)`` as Grafana resolves it."""
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", query)
        if m is None:
            raise DLRoverError(f"not a label_values() query: {query}")
        return self.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1), "start": f"{start:.0f}", "end": f"{end:.0f}"})

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def check_dashboard(prom: Prometheus, dash: dict, job_id: str, start: float, end: float) -> list[dict]:
    """Each query of the dashboard over [start, end] for one job: how many series answer."""
    rows = []
    for q in dashboard_queries(dash):
        rows.append({"where": q.where, "expr": render(q.expr, job_id), "series": len(prom.query_range(render(q.expr, job_id), start, end))})
    jobs = prom.label_values(variable_query(dash), start, end)
    rows.append({"where": "variable: job_id", "expr": variable_query(dash), "series": int(job_id in jobs)})
    return rows


@dataclass
class ObservedJob:
    """A finished job on a live head, with the Prometheus that scraped it while it ran."""

    head: "LocalHead"
    prom: Prometheus
    job_id: str
    start: float  # unix seconds around the job
    end: float
    rc: int


@contextmanager
def observed_job(spec: str | JobSpec = CHECK_JOB, runs_dir: str = "runs", quiet: bool = False) -> Iterator[ObservedJob]:
    """Ray head + Prometheus (``dashboards/prometheus.yml``) + ``spec`` submitted through
    Ray Jobs and followed to its end; both servers stay up inside the ``with``."""
    from dlrover.api.jobs import submit
    from dlrover.driver.localhead import LocalHead

    say = (lambda *a: None) if quiet else (lambda *a: print("[dashboards]", *a, flush=True))
    say("starting a Ray head on loopback ...")
    with LocalHead(num_cpus=8, metrics_report_ms=1000) as head:
        sd = loopback_targets(head.temp_dir, Path(head.temp_dir) / "loopback_sd.json", head.metrics_port)
        with Prometheus(prometheus_config(sd)) as prom:
            say(f"prometheus at {prom.url}; submitting {spec} to {head.address}")
            start = time.time()
            job = submit(spec, head.address, runs_dir=runs_dir)
            try:
                status = job.wait(JOB_TIMEOUT_S, out=None if quiet else sys.stdout)
            except TimeoutError as e:
                job.stop()
                print(f"{e}: stopped", file=sys.stderr)
                status = "STOPPED"
            time.sleep(3.0)  # a last scrape after the job's final values
            yield ObservedJob(head, prom, job.job_id, start, time.time(), 0 if status == "SUCCEEDED" else 1)


def run_check(spec: str = CHECK_JOB, dashboard: Path = DASHBOARD, runs_dir: str = "runs") -> int:
    """``dlrover dashboards check``: the whole loop on this machine; exit 1 if any query is empty."""
    dash = load_dashboard(dashboard)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops Ray and Prometheus
    with observed_job(spec, runs_dir) as job:
        if job.rc != 0:
            raise DLRoverError(f"the check job {job.job_id} did not succeed")
        rows = check_dashboard(job.prom, dash, job.job_id, job.start, job.end)
    width = max(len(r["where"]) for r in rows)
    for r in rows:
        print(f"{'ok     ' if r['series'] else 'NO DATA'} {r['where']:<{width}}  {r['series']} series")
    empty = [r for r in rows if not r["series"]]
    print(f"[dashboards] {len(rows) - len(empty)}/{len(rows)} queries returned data for {job.job_id}")
    return 1 if empty else 0


def install(session_dir: str = "/tmp/ray/session_latest", dashboard: Path = DASHBOARD) -> Path:
    """Copy the dashboard next to Ray's generated ones for ``session_dir``."""
    target = Path(session_dir) / "metrics" / "grafana" / "dashboards"
    if not target.is_dir():
        raise DLRoverError(f"{target}: no Ray Grafana dashboards here (is {session_dir} a Ray session started with the dashboard?)")
    load_dashboard(dashboard)
    out = target / "dlrover_grafana_dashboard.json"
    shutil.copyfile(dashboard, out)
    ini = Path(session_dir) / "metrics" / "grafana" / "grafana.ini"
    print(f"installed {out}")
    print(f"start Grafana with Ray's provisioning: grafana-server --config {ini} --homepath <grafana home> web")
    return out

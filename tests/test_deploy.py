"""deploy/: the image, the KubeRay manifests and the monitoring wiring, checked without a cluster.

No Kubernetes cluster or Docker daemon is needed (nor used): the RayCluster and RayJob are
validated against KubeRay's own CRD schema (deploy/crds/, from KubeRay 1.7.0), with
unknown fields rejected as ``kubectl apply``'s strict field validation would; the job the
RayJob runs is parsed by dlrover's own CLI parser and its spec loaded by dlrover's spec
loader; the Dockerfile is read for what it runs and copies.
"""

from __future__ import annotations

import copy
import fnmatch
import gzip
import json
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

from dlrover.cli.main import build_parser
from dlrover.resource.configs import Config
from dlrover.driver.runner import required_cpus
from dlrover.spec import load_spec, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
MONITORING = DEPLOY / "monitoring"
DOCKERFILE = DEPLOY / "Dockerfile"
INSTALL_SH = ROOT / "scripts" / "install.sh"
MB = 1 << 20


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path: Path) -> dict:
    (doc,) = docs(path)
    return doc


@cache
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def ray_pin() -> str:
    (pin,) = [d.split("==")[1] for d in pyproject()["project"]["dependencies"] if d.startswith("ray[default]==")]
    return pin


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def instructions(name: str) -> list[str]:
    return [args for op, args in dockerfile() if op == name]


def workdir() -> str:
    (wd,) = instructions("WORKDIR")
    return wd


def venv_dir() -> str:
    (run,) = [r for r in instructions("RUN") if "scripts/install.sh" in r]
    return re.search(r"\bVENV=(\S+)", run).group(1)


def quantity(q: str | int) -> float:
    """A Kubernetes quantity ("4", "500m", "8Gi", "1G") as a number (CPUs or bytes)."""
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    assert m, f"not a quantity: {q!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(m.group(1)) * scale[m.group(2)]


# --------------------------------------------------------------------------- manifests


def cluster_specs() -> list[tuple[str, dict]]:
    return [("raycluster.yaml", one(KUBERAY / "raycluster.yaml")["spec"]), ("rayjob.yaml", one(KUBERAY / "rayjob.yaml")["spec"]["rayClusterSpec"])]


def groups(spec: dict) -> list[tuple[dict, dict]]:
    """(group spec, its Ray container) of the head group and each worker group."""
    out = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [(g, g["template"]["spec"]["containers"][0]) for g in out]


def test_manifests_are_kubernetes_objects_with_names():
    kinds = {}
    for path in [*sorted(KUBERAY.glob("*.yaml")), MONITORING / "podmonitor.yaml"]:
        for doc in docs(path):
            assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"), f"{path.name}: {doc}"
            kinds[doc["kind"]] = doc["apiVersion"]
    assert kinds == {"PersistentVolumeClaim": "v1", "RayCluster": "ray.io/v1", "RayJob": "ray.io/v1", "PodMonitor": "monitoring.coreos.com/v1"}


def strict(schema: dict) -> dict:
    """The schema with unknown fields rejected, as the API server's strict field validation
    does (by default, the schema alone would let a misspelled field through, pruned)."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [strict(s) for s in out[key]]
    return out


@cache
def validator(kind: str) -> jsonschema.Draft7Validator:
    wrapped = json.loads(gzip.decompress((DEPLOY / "crds" / f"{kind.lower()}s.v1.schema.json.gz").read_bytes()))
    assert wrapped["kind"] == kind and wrapped["group"] == "ray.io" and wrapped["version"] == "v1"
    return jsonschema.Draft7Validator(strict(wrapped["schema"]))


def schema_errors(doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(doc["kind"]).iter_errors(doc)]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_manifest_matches_the_kuberay_crd_schema(name):
    doc = one(KUBERAY / name)
    assert doc["apiVersion"] == "ray.io/v1"
    assert schema_errors(doc) == []


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d["spec"].update(entrypont=d["spec"].pop("entrypoint")), "'entrypont' was unexpected"),
        (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"), "'groupName' is a required property"),
        (
            lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(cpu="four"),
            "does not match",
        ),
    ],
)
def test_schema_check_rejects_a_misspelled_field_a_missing_one_and_a_bad_quantity(mutate, needle):
    doc = copy.deepcopy(one(KUBERAY / "rayjob.yaml"))
    mutate(doc)
    assert any(needle in e for e in schema_errors(doc)), schema_errors(doc)


def test_rayjob_starts_the_same_cluster_as_raycluster_yaml():
    (_, cluster), (_, job_cluster) = cluster_specs()
    assert job_cluster == cluster


def test_ray_version_and_image_are_the_projects():
    image = f"dlrover-ray:{pyproject()['project']['version']}"
    for name, spec in cluster_specs():
        assert spec["rayVersion"] == ray_pin(), name
        assert {c["image"] for _, c in groups(spec)} == {image}, name
    assert f"-t {image} " in DOCKERFILE.read_text() and f"-t {image} " in (DEPLOY / "README.md").read_text()


def test_every_ray_pod_mounts_the_shared_volume_and_runs_in_the_image_workdir():
    claim = one(KUBERAY / "shared-storage.yaml")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for name, spec in cluster_specs():
        for group, container in groups(spec):
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert volumes[mounts["/mnt/shared"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], name
            shm = volumes[mounts["/dev/shm"]]["emptyDir"]
            assert shm["medium"] == "Memory" and quantity(shm["sizeLimit"]) >= int(group["rayStartParams"]["object-store-memory"]), name
            assert container["workingDir"] == workdir(), name
            assert pod["securityContext"]["fsGroup"] == 100, name  # the image's ray user is in group users (100)
    assert "--gid 100" in DOCKERFILE.read_text()


def test_a_dashboard_open_to_the_pod_network_requires_rays_token():
    readme = (DEPLOY / "README.md").read_text()
    for name, spec in cluster_specs():
        assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0", name
        auth = spec["authOptions"]
        assert auth["mode"] == "token", name
        assert f"kubectl create secret generic {auth['secretName']} --from-literal=auth_token=" in readme, name


def test_head_exposes_the_dashboard_and_every_node_its_metrics_port():
    monitor = one(MONITORING / "podmonitor.yaml")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    scrape = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    port_regexes = [r["regex"] for r in scrape["scrape_configs"][0]["relabel_configs"] if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]]
    for name, spec in cluster_specs():
        head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert {"containerPort": 8265, "name": "dashboard"} in head["ports"], name
        assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0", name
        for group, container in groups(spec):
            port = int(group["rayStartParams"]["metrics-export-port"])
            assert {"containerPort": port, "name": endpoint["port"]} in container["ports"], name
            assert port_regexes == [endpoint["port"]]
    namespaces = {one(KUBERAY / n)["metadata"].get("namespace", "default") for n in ("raycluster.yaml", "rayjob.yaml")}
    assert namespaces <= set(monitor["spec"]["namespaceSelector"]["matchNames"])


def entrypoint_args():
    entrypoint = one(KUBERAY / "rayjob.yaml")["spec"]["entrypoint"]
    # KubeRay pastes the entrypoint into a bash command line (`ray job submit ... -- <entrypoint>`).
    assert not re.search(r"[;&|<>$`\\\"'*?\[\]{}()]", entrypoint), f"shell metacharacters in the entrypoint: {entrypoint}"
    argv = shlex.split(entrypoint)
    assert argv[:4] == [f"{venv_dir()}/bin/python", "-m", "dlrover", "run"], argv
    return build_parser().parse_args(argv[3:])


def test_rayjob_entrypoint_runs_a_job_spec_of_this_repo_that_validates():
    args = entrypoint_args()
    assert args.spec.startswith(workdir() + "/"), f"{args.spec}: not in the image's copy of the repo ({workdir()})"
    local = ROOT / args.spec.removeprefix(workdir() + "/")
    assert local.is_file(), local
    spec = load_spec(local, parse_overrides(args.set))
    # Data, runs and checkpoints on the volume every node mounts.
    assert args.runs_dir.startswith("/mnt/shared/") and spec.checkpoint.dir is None
    assert spec.data.synth is not None and spec.data.synth.out.startswith("/mnt/shared/")
    assert spec.data.paths == [spec.data.synth.out]


def test_rayjob_metadata_is_what_dlrover_submit_would_attach():
    args = entrypoint_args()
    spec = load_spec(ROOT / args.spec.removeprefix(workdir() + "/"), parse_overrides(args.set))
    meta = one(KUBERAY / "rayjob.yaml")["spec"]["metadata"]
    assert meta == {"name": spec.name, "policy": spec.policy.name, "requested": Config.from_resources(spec.resources).short()}


def test_the_job_fits_the_worker_pods_with_room_for_a_live_rescale():
    args = entrypoint_args()
    spec = load_spec(ROOT / args.spec.removeprefix(workdir() + "/"), parse_overrides(args.set))
    r = spec.resources
    for name, cluster in cluster_specs():
        assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", name  # training actors go to workers
        workers = [(g, c) for g, c in groups(cluster)[1:]]
        cpus = sum(g["replicas"] * quantity(c["resources"]["limits"]["cpu"]) for g, c in workers)
        node_mem = [quantity(c["resources"]["limits"]["memory"]) - int(g["rayStartParams"]["object-store-memory"]) for g, c in workers]
        mem = sum(g["replicas"] * m for (g, _), m in zip(workers, node_mem))
        assert 2 * required_cpus(spec) <= cpus, name
        assert 2 * (r.workers * r.worker_memory_mb + r.ps * r.ps_memory_mb) * MB <= mem, name
        assert max(r.worker_memory_mb, r.ps_memory_mb) * MB <= max(node_mem), name


# --------------------------------------------------------------------------- image


def test_dockerfile_runs_install_sh_as_a_non_root_user_into_a_venv_on_path():
    ops = [op for op, _ in dockerfile()]
    (base,) = instructions("FROM")
    (arg,) = [a for a in instructions("ARG") if a.startswith("PYTHON_VERSION=")]
    python = arg.split("=", 1)[1]
    assert base.startswith("python:${PYTHON_VERSION}-slim")
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}", "the image's Python is not the one the tests run on"
    assert tuple(map(int, python.split("."))) >= (3, 10) and pyproject()["project"]["requires-python"] == ">=3.10"
    install = next(i for i, (op, a) in enumerate(dockerfile()) if op == "RUN" and "bash scripts/install.sh" in a)
    user = max(i for i, op in enumerate(ops[:install]) if op == "USER")
    assert dockerfile()[user][1] not in ("root", "0")  # so install.sh skips its apt-get step
    assert "PYTHON=python3" in dockerfile()[install][1]
    assert any(e.startswith(f"PATH={venv_dir()}/bin:") for e in instructions("ENV"))
    text = INSTALL_SH.read_text()
    assert "VENV=${VENV:-" in text and "PY=${PYTHON:-" in text and '"$(id -u)" == 0' in text
    assert (ROOT / "pyproject.toml").is_file() and '-e ".[test,tracking]"' in text
    assert "DLROVER_MLFLOW_SERVER=0" in dockerfile()[install][1]  # the tests' MLflow server stays out of the image


def pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"([A-Za-z][A-Za-z0-9_.-]*(?:\[[a-z,]+\])?)==([0-9][0-9A-Za-z.+]*)", text))


def test_dockerfile_leaves_every_version_pin_to_install_sh():
    text = DOCKERFILE.read_text()
    owned = {**pins(INSTALL_SH.read_text()), **pins(json.dumps(pyproject()["project"]["dependencies"]))}
    assert {"torch", "fbgemm-gpu-cpu", "torchrec", "ray[default]"} <= set(owned)
    assert all(owned.get(name) == version for name, version in pins(text).items()), pins(text)
    assert "pip install" not in text and "torch==" not in text


def test_build_context_keeps_what_the_image_needs_and_drops_local_state():
    patterns = [p.strip() for p in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert {".venv", ".git", "data", "runs"} <= set(patterns)

    def excluded(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(fnmatch.fnmatch(p, pat) for p in prefixes for pat in patterns)

    needed = ["pyproject.toml", "README.md", "scripts/install.sh", "dlrover/cli/main.py", "jobs/quickstart.yaml", "policies/dlrover_rm.yaml"]
    assert all((ROOT / p).exists() for p in needed)
    assert [p for p in needed if excluded(p)] == []
    assert excluded(".venv/bin/python") and excluded("data/quickstart/part-00000.tsv")
    assert [a for a in instructions("COPY") if a.split()[-2:] == [".", "."]], "the Dockerfile copies the build context (the repo root)"


# --------------------------------------------------------------------------- monitoring


def test_dashboard_configmap_is_generated_from_the_repos_dashboard():
    kust = one(MONITORING / "kustomization.yaml")
    assert all((MONITORING / r).is_file() for r in kust["resources"])
    (gen,) = kust["configMapGenerator"]
    assert gen["options"]["labels"] == {"grafana_dashboard": "1"}
    (source,) = gen["files"]
    key, rel = source.split("=", 1)
    assert (MONITORING / rel).resolve() == ROOT / "dashboards" / "dlrover.json" and key == "dlrover.json"
    assert json.loads((MONITORING / rel).read_text())["uid"]
    assert kust["namespace"] == one(MONITORING / "podmonitor.yaml")["metadata"]["namespace"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) not installed")
def test_kustomize_renders_the_dashboard_configmap_and_the_podmonitor():
    cmd = ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(MONITORING)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    objs = {d["kind"]: d for d in yaml.safe_load_all(out)}
    assert set(objs) == {"ConfigMap", "PodMonitor"}
    cm = objs["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == "prometheus-system"
    assert json.loads(cm["data"]["dlrover.json"]) == json.loads((ROOT / "dashboards" / "dlrover.json").read_text())


# --------------------------------------------------------------------------- docs


def test_docs_name_only_deploy_files_that_exist():
    readme = (DEPLOY / "README.md").read_text()
    title = "## Deployment on a Ray cluster (KubeRay)\n"
    top = (ROOT / "README.md").read_text()
    assert title in top
    top = top.split(title, 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b(?:deploy|jobs|dashboards|scripts)/[\w./-]*\w", readme + top))
    assert "deploy/kuberay/rayjob.yaml" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], missing
    assert "kubectl kustomize --load-restrictor LoadRestrictionsNone deploy/monitoring" in readme

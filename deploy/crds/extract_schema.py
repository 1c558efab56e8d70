"""Write a KubeRay CRD's v1 OpenAPI schema as the small file tests/test_deploy.py validates with.

A CRD file of KubeRay is about 1 MB of YAML, mostly field descriptions: this keeps the
``v1`` version's ``openAPIV3Schema`` without them, as sorted compact JSON, gzipped
(deterministically), next to where it came from. To refresh for another KubeRay release,
download ``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` and
``ray.io_rayjobs.yaml`` of its tag (or take them from the chart's ``crds/``), then:

    python deploy/crds/extract_schema.py ray.io_rayclusters.yaml v1.7.0 deploy/crds/rayclusters.v1.schema.json.gz
    python deploy/crds/extract_schema.py ray.io_rayjobs.yaml v1.7.0 deploy/crds/rayjobs.v1.schema.json.gz
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import yaml


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def extract(crd_path: str, release: str) -> dict:
    raw = Path(crd_path).read_bytes()
    crd = yaml.safe_load(raw)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return {
        "source": f"ray-project/kuberay {release}: ray-operator/config/crd/bases/{Path(crd_path).name} (Apache-2.0), descriptions removed",
        "crd_sha256": hashlib.sha256(raw).hexdigest(),
        "group": crd["spec"]["group"],
        "kind": crd["spec"]["names"]["kind"],
        "version": "v1",
        "schema": strip_descriptions(version["schema"]["openAPIV3Schema"]),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    crd_path, release, out = argv
    data = json.dumps(extract(crd_path, release), sort_keys=True, separators=(",", ":")).encode()
    Path(out).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {out} ({len(data):,} bytes of JSON)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

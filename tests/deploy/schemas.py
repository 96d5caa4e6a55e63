"""JSON schemas for kubeconform, made offline (tests/deploy/run.sh calls this).

  schemas.py kubernetes WHEEL OUT VERSION...  the strict schemas of these Kubernetes versions,
                                              from the kubernetes-validate wheel (PyPI)
  schemas.py crd CRD_JSON OUT                 a CustomResourceDefinition's schemas

kubernetes-validate ships, per Kubernetes release, one schema per kind generated from that
release's OpenAPI spec ("<kind>-<group>-<version>.json", the names kubeconform looks up), with
an https://kubernetes.io/... `$id` and `$ref`s to "/api/_definitions.json". Resolved against the
`$id`, those would send kubeconform to the network; rewritten to "_definitions.json", they
resolve to the file beside the schema.

A CRD becomes OUT/<group>/<kind>_<version>.json per served version: its openAPIV3Schema, with
`additionalProperties: false` on every object that lists its properties (kubeconform's -strict
for built-in kinds) and `nullable` turned into a "null" type.
"""

import json
import sys
import zipfile
from pathlib import Path

WHEEL_ROOT = "kubernetes_validate/kubernetes-json-schema"


def kubernetes(wheel: str, out: str, versions: list[str]) -> None:
    out_dir = Path(out)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for version in versions:
            folder = f"v{version}-local-strict"
            prefix = f"{WHEEL_ROOT}/{folder}/"
            members = [n for n in names if n.startswith(prefix) and n.endswith(".json")]
            if not members:
                sys.exit(f"{wheel} has no schemas for Kubernetes {version} ({prefix})")
            target = out_dir / folder
            target.mkdir(parents=True, exist_ok=True)
            for name in members:
                schema = json.loads(z.read(name))
                schema.pop("$id", None)
                text = json.dumps(schema).replace('"/api/_definitions.json#', '"_definitions.json#')
                (target / name[len(prefix):]).write_text(text)
            print(f"  Kubernetes {version}: {len(members)} schemas in {target}")


def strict(node):
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items()}
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def crd(path: str, out: str) -> None:
    doc = json.loads(Path(path).read_text())
    if doc.get("kind") != "CustomResourceDefinition":
        sys.exit(f"{path} is not a CustomResourceDefinition")
    spec = doc["spec"]
    kind = spec["names"]["kind"].lower()
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        target = Path(out) / spec["group"] / f"{kind}_{version['name']}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(strict(version["schema"]["openAPIV3Schema"])))
        print(f"  {spec['names']['kind']} {spec['group']}/{version['name']}: {target}")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "kubernetes":
        kubernetes(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "crd":
        crd(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

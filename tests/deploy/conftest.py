"""Fixtures of the chart tests. run.sh packages the chart (SLUICE_DEPLOY_CHART), renders it
(helm template) into SLUICE_DEPLOY_RENDERED as <values>-<kube version>.yaml, and passes the helm
it built as HELM."""

import base64
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_SOURCE = ROOT / "deploy/helm/sluice"
FULL_VALUES = ROOT / "tests/deploy/values-full.yaml"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through tests/deploy/run.sh")
    return value


# Object name prefixes: release "sluice" with the default values, fullnameOverride "shuffle" in
# values-full.yaml.
PREFIX = {"default": "sluice", "full": "shuffle"}


class Render:
    """The objects of one `helm template`, looked up by kind and name; `coordinator` and `server`
    name the StatefulSets (and their Services and budgets)."""

    def __init__(self, objects: list[dict], prefix: str = "sluice"):
        self.objects = objects
        self.which = next((w for w, p in PREFIX.items() if p == prefix), prefix)
        self.coordinator = f"{prefix}-coordinator"
        self.server = f"{prefix}-server"

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def get(self, kind: str, name: str) -> dict:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
        return found[0]

    def maybe(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def container(self, statefulset: str) -> dict:
        (container,) = self.pod(statefulset)["containers"]
        return container

    def pod(self, statefulset: str) -> dict:
        return self.get("StatefulSet", statefulset)["spec"]["template"]["spec"]

    def env(self, statefulset: str) -> dict:
        return {e["name"]: e for e in self.container(statefulset)["env"]}

    def config(self, key: str) -> str:
        for cm in self.maybe("ConfigMap"):
            if key in cm.get("data", {}):
                return cm["data"][key]
        raise AssertionError(f"no ConfigMap holds {key}")

    def secret_value(self, name: str, key: str) -> str:
        return base64.b64decode(self.get("Secret", name)["data"][key]).decode()


def parse(text: str, prefix: str = "sluice") -> Render:
    return Render([d for d in yaml.safe_load_all(text) if d], prefix)


@pytest.fixture(params=list(PREFIX))
def render(request) -> Render:
    """The default render, then the full one."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def template():
    """`helm template` of the packaged chart with extra arguments; the caller checks the outcome."""
    helm, chart = _env("HELM"), _env("SLUICE_DEPLOY_CHART")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [helm, "template", "sluice", chart, "--namespace", "sluice", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture(scope="session")
def renders() -> dict[tuple[str, str], Render]:
    """Every render run.sh made, by (values, Kubernetes version)."""
    out = Path(_env("SLUICE_DEPLOY_RENDERED"))
    found = {}
    for kube in _env("SLUICE_DEPLOY_KUBE_VERSIONS").split():
        for values in ("default", "full"):
            found[(values, kube)] = parse((out / f"{values}-{kube}.yaml").read_text(), PREFIX[values])
    return found


@pytest.fixture(scope="session")
def default(renders) -> Render:
    return next(r for (values, _), r in renders.items() if values == "default")


@pytest.fixture(scope="session")
def full(renders) -> Render:
    return next(r for (values, _), r in renders.items() if values == "full")


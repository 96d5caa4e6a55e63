#!/usr/bin/env bash
# Validation of the Helm chart deploy/helm/sluice, offline, as `make test-deploy` runs it:
#   1. helm package (as published: the dashboard link resolved), then helm lint --strict of the
#      package with the default values and with tests/deploy/values-full.yaml;
#   2. helm template with both, for the oldest Kubernetes the chart supports and the newest
#      whose schemas we have;
#   3. kubeconform -strict on every rendered object against those versions' schemas, and the
#      ServiceMonitor against its CRD's schema; every object must be found valid;
#   4. every PromQL expression of deploy/grafana/sluice.json through Prometheus's parser
#      (tests/deploy/promql);
#   5. pytest tests/deploy: what the objects say (config, drain hook, probes, secrets, refused
#      values, the dashboard's metric names against the code, the config against the binary).
# Tools are built once from their Go modules into target/deploy-tools (SLUICE_DEPLOY_TOOLS),
# schemas come from a PyPI wheel and a Go module: nothing else is fetched.
# Usage: tests/deploy/run.sh [pytest args...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
started=$SECONDS

HELM_VERSION=v3.22.0
HELM_KUBE_MINOR=37 # client-go v0.37 in helm's go.mod: the Kubernetes version helm assumes
KUBECONFORM_VERSION=v0.7.0
SCHEMAS_PACKAGE=kubernetes-validate==1.37.0
SCHEMAS_WHEEL=kubernetes_validate-1.37.0-py3-none-any.whl
SCHEMAS_WHEEL_SHA256=85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9
PROMETHEUS_OPERATOR_VERSION=v0.85.0
# The chart's kubeVersion floor and the newest release the wheel has schemas for.
KUBE_VERSIONS=(1.27.0 1.37.0)

CHART=deploy/helm/sluice
FULL_VALUES=tests/deploy/values-full.yaml
TOOLS="${SLUICE_DEPLOY_TOOLS:-$ROOT/target/deploy-tools}"
OUT="$ROOT/target/deploy-test"
mkdir -p "$TOOLS"
rm -rf "$OUT" && mkdir -p "$OUT"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# go_tool NAME VERSION PACKAGE LDFLAGS: the path of NAME, built with `go install` unless present.
go_tool() {
  local dir="$TOOLS/$1-$2"
  if [[ ! -x "$dir/$1" ]]; then
    command -v go >/dev/null || fail "go not found: it builds $1 $2 (install Go first)"
    echo "building $1 $2 with go install (first run only; a few minutes on 2 cores)" >&2
    GOBIN="$dir.tmp" GOFLAGS=-modcacherw go install -trimpath -ldflags "$4" "$3@$2" >&2
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/$1"
}

echo "== tools"
HELM=$(go_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION $(
    for pkg in pkg/chartutil pkg/lint/rules; do
      printf -- '-X helm.sh/helm/v3/%s.k8sVersionMajor=1 -X helm.sh/helm/v3/%s.k8sVersionMinor=%s ' \
        "$pkg" "$pkg" "$HELM_KUBE_MINOR"
    done
  )")
KUBECONFORM=$(go_tool kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform "-s -w")
echo "helm $("$HELM" version --short), kubeconform $KUBECONFORM_VERSION"
python3 -c 'import pytest, yaml' || fail "python3 needs pytest and PyYAML (pip install pytest pyyaml)"

echo "== schemas"
K8S_SCHEMAS="$TOOLS/schemas-$SCHEMAS_WHEEL"
if [[ ! -f "$K8S_SCHEMAS/.complete" ]]; then
  rm -rf "$K8S_SCHEMAS" "$TOOLS/wheel"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$TOOLS/wheel" "$SCHEMAS_PACKAGE"
  echo "$SCHEMAS_WHEEL_SHA256  $TOOLS/wheel/$SCHEMAS_WHEEL" | sha256sum -c --quiet - ||
    fail "$SCHEMAS_WHEEL does not have the pinned sha256"
  python3 tests/deploy/schemas.py kubernetes "$TOOLS/wheel/$SCHEMAS_WHEEL" "$K8S_SCHEMAS" "${KUBE_VERSIONS[@]}"
  touch "$K8S_SCHEMAS/.complete"
  rm -rf "$TOOLS/wheel"
fi
CRD_SCHEMAS="$TOOLS/schemas-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
if [[ ! -f "$CRD_SCHEMAS/.complete" ]]; then
  rm -rf "$CRD_SCHEMAS"
  module_dir=$(cd "$TOOLS" && GOFLAGS=-modcacherw go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  python3 tests/deploy/schemas.py crd "$module_dir/jsonnet/prometheus-operator/servicemonitors-crd.json" "$CRD_SCHEMAS"
  touch "$CRD_SCHEMAS/.complete"
fi
echo "Kubernetes ${KUBE_VERSIONS[*]} from $SCHEMAS_PACKAGE; ServiceMonitor from prometheus-operator $PROMETHEUS_OPERATOR_VERSION"

echo "== helm package + lint"
# (helm says once that it follows dashboards/sluice.json to deploy/grafana/sluice.json.)
"$HELM" package "$CHART" --destination "$OUT"
PACKAGE=$(echo "$OUT"/sluice-*.tgz)
"$HELM" lint --strict "$PACKAGE"
"$HELM" lint --strict "$PACKAGE" -f "$FULL_VALUES"

echo "== helm template + kubeconform"
for kube in "${KUBE_VERSIONS[@]}"; do
  for values in default full; do
    args=()
    [[ $values == full ]] && args=(-f "$FULL_VALUES")
    rendered="$OUT/$values-$kube.yaml"
    "$HELM" template sluice "$PACKAGE" --namespace sluice --kube-version "$kube" "${args[@]}" >"$rendered"
    report="$OUT/$values-$kube.kubeconform.json"
    "$KUBECONFORM" -strict -summary -verbose -output json -kubernetes-version "$kube" \
      -schema-location "$K8S_SCHEMAS/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
      -schema-location "$CRD_SCHEMAS/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
      "$rendered" >"$report" || true
    # Every rendered object must have been checked and found valid: a missing schema, a
    # skipped object or an empty render fails here too.
    python3 - "$rendered" "$report" "$values values, Kubernetes $kube" <<'EOF' || fail "kubeconform: $values values, Kubernetes $kube"
import collections, json, sys, yaml
rendered, report, what = sys.argv[1:]
objects = [d for d in yaml.safe_load_all(open(rendered)) if d]
result = json.load(open(report))
bad = [r for r in result.get("resources", []) if r["status"] != "statusValid"]
for r in bad:
    print(f"  {r['kind']} {r['name']}: {r['status']} {r.get('msg', '')}")
summary = result["summary"]
kinds = collections.Counter(o["kind"] for o in objects)
print(f"{what}: {summary['valid']} of {len(objects)} objects valid "
      f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")
sys.exit(1 if bad or not objects or summary["valid"] != len(objects) else 0)
EOF
  done
done

echo "== dashboard PromQL"
# Rebuilt when its source or pinned modules change.
PROMQL="$TOOLS/promql-$(cat tests/deploy/promql/{go.mod,go.sum,main.go} | sha256sum | cut -c1-12)"
if [[ ! -x "$PROMQL" ]]; then
  (cd tests/deploy/promql && GOFLAGS=-modcacherw go build -trimpath -o "$PROMQL.tmp" . && mv "$PROMQL.tmp" "$PROMQL")
fi
"$PROMQL" deploy/grafana/sluice.json

echo "== pytest tests/deploy"
HELM="$HELM" SLUICE_DEPLOY_CHART="$PACKAGE" SLUICE_DEPLOY_RENDERED="$OUT" SLUICE_DEPLOY_KUBE_VERSIONS="${KUBE_VERSIONS[*]}" \
  python3 -m pytest -p no:cacheprovider -q -rsx tests/deploy "$@"

echo "deploy checks passed in $((SECONDS - started)) s"

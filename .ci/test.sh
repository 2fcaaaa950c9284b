#!/usr/bin/env bash
# The project's test command (README): installs what is missing, starts a real
# Redis and a real single-node OpenSearch, runs every check and both test
# tiers, then stops exactly the servers it started.
#   usage: bash .ci/test.sh [extra pytest args]
# Caches: uv's cache (~/.cache/uv) and Maven's local repository (~/.m2), so a
# second run on the same machine downloads nothing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
work=$root/.ci/.work
step() { printf '\n== %s\n' "$*"; }

step "tools"
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
fi
uv --version
uv sync --frozen --quiet
export PATH="$root/.venv/bin:$PATH"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step "servers"
rm -rf "$work"
mkdir -p "$work"
started=()
cleanup() {
  local rc=$?
  for s in "${started[@]}"; do
    bash ".ci/stop-$s.sh" "$work/$s" || true
  done
  exit "$rc"
}
trap cleanup EXIT
redis_port=$(free_port)
bash .ci/start-redis.sh "$redis_port" "$work/redis"
started+=(redis)
opensearch_port=$(free_port)
bash .ci/start-opensearch.sh "$opensearch_port" "$work/opensearch"
started+=(opensearch)
export ATTEST_TEST_REDIS_URL="redis://127.0.0.1:$redis_port"
export ATTEST_TEST_OPENSEARCH_URL="http://127.0.0.1:$opensearch_port"

step "lint and types"
ruff check services tests loadtest
ruff format --check services tests loadtest
mypy
(cd protos && buf lint)

step "generated stubs are current"
fresh=$(mktemp -d)
bash protos/generate.sh "$fresh" >/dev/null
if ! diff -r services/attestpb/attest "$fresh/attest"; then
  echo "services/attestpb is stale: run bash protos/generate.sh and commit the result" >&2
  exit 1
fi
rm -rf "$fresh"

step "deploy checks: Helm chart (lint, template, schemas, tests), Dockerfiles, compose"
bash .ci/deploy-checks.sh

step "unit tests (no servers, no sockets)"
pytest tests/unit -q --durations=10 "$@"

step "integration tests (Redis $ATTEST_TEST_REDIS_URL, OpenSearch $ATTEST_TEST_OPENSEARCH_URL)"
pytest tests/integration -q -rs --durations=15 "$@"

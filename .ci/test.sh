#!/usr/bin/env bash
# The project's test command (README, docs/explanation/measured.md): installs what is missing, starts a real
# Redis, a real single-node OpenSearch and a real LLM server (llama.cpp with
# Gemma 3 270M), runs every check and the test tiers, then stops exactly the
# servers it started.
#   usage: bash .ci/test.sh [extra pytest args]
# Caches: uv's cache (~/.cache/uv), Maven's local repository (~/.m2) and the
# LLM server's wheel and venv (~/.cache/attest-ci), so a second run on the
# same machine downloads and compiles nothing.
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
# Debian's Chromium drives the evidence page's browser test
# (tests/integration/test_web_page.py fails under CI=true without it).
if ! command -v chromium >/dev/null 2>&1; then
  as_root=()
  if [[ $(id -u) != 0 ]]; then as_root=(sudo -n); fi
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends chromium
fi
chromium --version
# The LLM server's build (minutes of compiling on a cold machine) overlaps the
# project's download; it is waited for before anything else needs the cores.
rm -rf "$work"
mkdir -p "$work"
llm_env_log=$work/llm-env.log
bash .ci/llm-env.sh >"$llm_env_log" 2>&1 &
llm_env_pid=$!
uv sync --frozen --quiet
export PATH="$root/.venv/bin:$PATH"
# Bytecode is cached under the run's work folder. Where PYTHONDONTWRITEBYTECODE
# is set (as on the 2-core development machine) nothing cached it, and every
# Python process the tests start (servers, Celery workers, CLI runs: dozens)
# compiled torch, transformers and the rest from source again, about 12 s of
# CPU each.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$work/pycache
if ! wait "$llm_env_pid"; then
  tail -n 40 "$llm_env_log" >&2
  echo "the LLM server's environment could not be built" >&2
  exit 1
fi
grep '^llm-env:' "$llm_env_log" || true

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step "servers"
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
# The package layering ([tool.importlinter] in pyproject.toml): an upward import fails here.
lint-imports
# Declared dependencies ([tool.deptry] in pyproject.toml): every module the package
# imports is a declared dependency, and every declared one is imported.
deptry services
(cd protos && buf lint)
# Wire compatibility (protos/buf.yaml, breaking: FILE): the protos may change
# only in ways the previous ones still read. Compared with main's protos before
# this change: on a branch, the commit it forked from origin/main; on main, the
# previous commit. A clone without that history (shallow, or no .git) skips it.
head=$(git rev-parse -q --verify HEAD 2>/dev/null || true)
base=$(git merge-base HEAD origin/main 2>/dev/null || true)
if [[ -z $base || $base == "$head" ]]; then
  base=$(git rev-parse -q --verify 'HEAD~1^{commit}' 2>/dev/null || true)
fi
if [[ -n $base ]]; then
  previous=$(mktemp -d)
  git archive "$base" protos | tar -x -C "$previous"
  buf breaking protos --against "$previous/protos"
  echo "buf breaking: protos compatible with ${base:0:12}"
  rm -rf "$previous"
else
  echo "buf breaking: skipped, this clone has no earlier commit to compare with"
fi

step "generated stubs are current"
fresh=$(mktemp -d)
bash protos/generate.sh "$fresh" >/dev/null
if ! diff -r services/attestpb/attest "$fresh/attest"; then
  echo "services/attestpb is stale: run bash protos/generate.sh and commit the result" >&2
  exit 1
fi
rm -rf "$fresh"

step "docs site: mkdocs build --strict (internal links, anchors and the nav checked; generated reference)"
# mkdocs.yml turns every broken link or anchor and every page left out of the
# nav into a warning, and --strict makes a warning fail the build. External
# URLs are not fetched (CI has no network).
site=$(mktemp -d)
# Not --quiet: mkdocs 1.6 counts only the warnings it logs, so --quiet --strict passes a
# broken link.
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$site"
echo "docs site built with no warnings"
rm -rf "$site"

step "deploy checks: Helm chart (lint, template, schemas, tests), Dockerfiles, compose"
bash .ci/deploy-checks.sh

step "unit tests (no servers, no sockets)"
pytest tests/unit -q --durations=10 "$@"

step "integration tests (Redis $ATTEST_TEST_REDIS_URL, OpenSearch $ATTEST_TEST_OPENSEARCH_URL)"
pytest tests/integration -m "not llm" -q -rs --durations=15 "$@"

step "LLM tier: the generator on a real model (llama.cpp server, Gemma 3 270M)"
llm_port=$(free_port)
bash .ci/start-llm.sh "$llm_port" "$work/llm"
started+=(llm)
export ATTEST_TEST_LLM_URL="http://127.0.0.1:$llm_port"
# (exit 5, no test selected, is fine only when extra arguments chose other tests)
pytest tests/integration -m llm -v -rs --durations=0 "$@" || { rc=$? && ((rc == 5 && $# > 0)); }

#!/usr/bin/env bash
# Soak the Celery/OpenSearch stack on this machine, with no Docker (docs/soak.md).
#   usage: bash loadtest/soak_stack.sh MINUTES OUT_DIR [soak.py arguments...]
# Starts, each on a free port and under OUT_DIR/stack: a Redis and an OpenSearch
# node (the .ci scripts), `attest serve all` on them (BM25 in OpenSearch, the
# vectors in the embedded engine under OUT_DIR/stack/data, ingestion through
# Celery, the registry and job state in Redis) and one `attest worker` for the
# enrich, embed and index queues. Then runs loadtest/soak.py against it with the
# demo corpus ingested first, watching the server's RSS (the port's listener)
# and the worker's (its main process and pool, --watch worker=PID). The report
# goes to OUT_DIR (soak.json, soak.png), the processes' logs to OUT_DIR/stack.
# Stops exactly what it started, on success, on error, on Ctrl-C and on
# SIGTERM; the exit status is the soak's (0 passed, 1 a target missed, 2 a bad
# argument).
# Env: SOAK_WORKER_CONCURRENCY (pool processes of the worker, default 1),
#      OPENSEARCH_HEAP (default 1g), SOAK_KEEP_DATA=1 keeps the stores' files.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 MINUTES OUT_DIR [soak.py arguments...]" >&2
  exit 2
fi
minutes=$1
out_arg=$2
shift 2
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || {
  echo "soak_stack: MINUTES must be a number, for example 30 (got '$minutes')" >&2
  exit 2
}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out_arg"
out=$(cd "$out_arg" && pwd)
work=$out/stack
mkdir -p "$work"
py=$root/.venv/bin/python
[[ -x $py ]] || {
  echo "soak_stack: $py is missing: run 'uv sync' in $root first" >&2
  exit 2
}
cd "$root"
# Every process imports torch and the rest: cache their bytecode even where
# PYTHONDONTWRITEBYTECODE is set (as .ci/test.sh does).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$work/pycache

pids=()   # attest processes, stopped in reverse order
redis_started=false
opensearch_started=false
step_pid=""   # the step run by `step`, while it runs

# A signal whose trap is set waits, in bash, until the foreground command ends:
# a SIGTERM would wait out the whole soak (and a supervisor's SIGKILL after it
# would leave every server running). Each long step runs in the background and
# is waited for, which a trapped signal interrupts at once.
step() {
  "$@" &
  step_pid=$!
  local rc=0
  wait "$step_pid" || rc=$?
  step_pid=""
  return "$rc"
}

stop_pid() { # PID NAME: SIGTERM (a worker's warm shutdown), SIGKILL after 60 s
  local pid=$1 name=$2
  if ! kill -0 "$pid" 2>/dev/null; then
    # (Ctrl-C reaches the whole process group: the process may have stopped itself)
    echo "soak_stack: $name (pid $pid) had exited"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || { echo "soak_stack: stopped $name (pid $pid)"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  echo "soak_stack: killed $name (pid $pid): it did not stop within 60 s"
}

cleanup() {
  local rc=$?
  # A second Ctrl-C must not cut the stopping short and leave servers running.
  trap - EXIT
  trap '' INT TERM
  if [[ -n $step_pid ]] && kill -0 "$step_pid" 2>/dev/null; then
    kill -TERM "$step_pid" 2>/dev/null || true
  fi
  for ((k = ${#pids[@]} - 1; k >= 0; k--)); do
    stop_pid "${pids[k]%%:*}" "${pids[k]#*:}"
  done
  wait 2>/dev/null || true
  if $opensearch_started; then bash .ci/stop-opensearch.sh "$work/opensearch" || true; fi
  if $redis_started; then bash .ci/stop-redis.sh "$work/redis" || true; fi
  if [[ ${SOAK_KEEP_DATA:-0} != 1 ]]; then
    rm -rf "$work/opensearch/node" "$work/data" "$work/redis/dump.rdb" "$work/pycache"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "soak_stack: interrupted" >&2; exit 130' INT
trap 'echo "soak_stack: terminated" >&2; exit 143' TERM

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

redis_port=$(free_port)
redis_started=true
step bash .ci/start-redis.sh "$redis_port" "$work/redis"
opensearch_port=$(free_port)
opensearch_started=true
step bash .ci/start-opensearch.sh "$opensearch_port" "$work/opensearch"

port=$(free_port)
address=127.0.0.1:$port
redis=redis://127.0.0.1:$redis_port
export HF_HUB_OFFLINE=1
export ATTEST_ANSWER_HTTP__ENABLED=false
export ATTEST_DATA_DIR=$work/data
export ATTEST_LEXICAL_BACKEND=opensearch
export ATTEST_LEXICAL_OPENSEARCH__HOSTS="[\"http://127.0.0.1:$opensearch_port\"]"
export ATTEST_LEXICAL_INDEX_NAME=attest-soak
export ATTEST_SEMANTIC_STORE=edge
export ATTEST_INGEST_MODE=celery
export ATTEST_INGEST_STATE_URL=$redis/2
export ATTEST_PIPELINE_BROKER_URL=$redis/0
export ATTEST_PIPELINE_RESULT_BACKEND_URL=$redis/1
export ATTEST_PIPELINE_STATE_URL=$redis/2
# the worker's stages call the lexical and semantic services of `serve all`
export ATTEST_PIPELINE_LEXICAL_ADDRESS=$address
export ATTEST_PIPELINE_SEMANTIC_ADDRESS=$address

echo "soak_stack: serve all on $address (logs in $work)"
"$py" -m attest.cli serve all --port "$port" >"$work/serve.log" 2>&1 &
serve_pid=$!
pids+=("$serve_pid:serve all")
"$py" -m attest.cli worker --queues enrich,embed,index \
  --concurrency "${SOAK_WORKER_CONCURRENCY:-1}" >"$work/worker.log" 2>&1 &
worker_pid=$!
pids+=("$worker_pid:worker")

# Serving once the answer service's health check says so (models load first).
step "$py" -c "$(cat <<'EOF'
import os, sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

address, serve_pid, worker_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 600
with grpc.insecure_channel(address) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="attest.answer.v1.AnswerService")
    while True:
        for pid, name in ((serve_pid, "serve all"), (worker_pid, "the worker")):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                sys.exit(f"soak_stack: {name} exited during start-up: see its log")
        try:
            if stub.Check(request, timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            sys.exit("soak_stack: serve all is not serving after 600 s: see serve.log")
        time.sleep(1)
EOF
)" "$address" "$serve_pid" "$worker_pid"
echo "soak_stack: serving; serve all pid $serve_pid, worker pid $worker_pid"

rc=0
step "$py" loadtest/soak.py --address "$address" --pid "$serve_pid" --watch "worker=$worker_pid" \
  --ingest-sample --minutes "$minutes" --out "$out" "$@" || rc=$?
for p in "$serve_pid" "$worker_pid"; do
  kill -0 "$p" 2>/dev/null || { echo "soak_stack: pid $p exited during the soak" >&2; rc=1; }
done
exit "$rc"

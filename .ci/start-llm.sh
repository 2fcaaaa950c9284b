#!/usr/bin/env bash
# Start the local LLM server (llama-cpp-python's OpenAI-compatible server with the packaged
# Gemma 3 270M) on 127.0.0.1:PORT, building or reusing its environment (.ci/llm-env.sh).
#   usage: .ci/start-llm.sh PORT DATA_DIR
# PID in DATA_DIR/llm.pid, log in DATA_DIR/llm.log. Idempotent: if the PID file names a
# live server it only waits for GET /v1/models. Stop with .ci/stop-llm.sh DATA_DIR.
# Env: LLM_START_TIMEOUT (s, default 120), LLM_THREADS (default: the number of cores).
set -euo pipefail
trap 'echo "llm: $(basename "$0") failed at line $LINENO" >&2' ERR

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PORT DATA_DIR" >&2
  exit 2
fi
port=$1
[[ $port =~ ^[0-9]+$ ]] || { echo "llm: bad port '$port'" >&2; exit 2; }
mkdir -p "$2"
data_dir=$(cd "$2" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pid_file=$data_dir/llm.pid
log_file=$data_dir/llm.log
timeout=${LLM_START_TIMEOUT:-120}
threads=${LLM_THREADS:-$(nproc)}
url=http://127.0.0.1:$port

alive() { # PID -> true if it exists and is not a zombie
  kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

is_our_server() { # PID -> true if it is alive and is a llama_cpp.server
  [[ $1 =~ ^[0-9]+$ ]] && alive "$1" &&
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'llama_cpp\.server'
}

if [[ -f $pid_file ]] && pid=$(cat "$pid_file") && is_our_server "$pid"; then
  echo "llm: already running (pid $pid), waiting for $url"
else
  rm -f "$pid_file"
  if timeout 2 bash -c ">/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    echo "llm: port $port is already in use by a process this script did not start" >&2
    exit 1
  fi
  start=$SECONDS
  env_out=$(bash "$here/llm-env.sh")
  python=$(sed -n 's/^LLM_PYTHON=//p' <<<"$env_out")
  model=$(sed -n 's/^LLM_MODEL=//p' <<<"$env_out")
  echo "llm: environment ready in $((SECONDS - start))s; starting on $url (model $model)"
  # Greedy decoding (the client sends temperature 0) with a fixed seed; Gemma's chat
  # template (without --chat_format the server falls back to llama-2's); requests
  # queue instead of a new one cutting a streamed reply short.
  nohup "$python" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port "$port" \
    --n_ctx 4096 --chat_format gemma --seed 0 --interrupt_requests false \
    --n_threads "$threads" --n_threads_batch "$threads" >"$log_file" 2>&1 </dev/null &
  echo $! >"$pid_file"
fi

pid=$(cat "$pid_file")
start=$SECONDS
until curl -fs --max-time 5 "$url/v1/models" >/dev/null 2>&1; do
  if ! alive "$pid"; then
    echo "llm: the server exited" >&2
    tail -n 30 "$log_file" >&2 2>/dev/null || true
    rm -f "$pid_file"
    exit 1
  fi
  if ((SECONDS - start >= timeout)); then
    echo "llm: no answer from $url/v1/models after ${timeout}s" >&2
    tail -n 30 "$log_file" >&2 2>/dev/null || true
    exit 1
  fi
  sleep 0.5
done
echo "llm: up on $url (pid $pid)"

#!/usr/bin/env bash
# Stop the LLM server started by .ci/start-llm.sh: only the PID in DATA_DIR/llm.pid.
#   usage: .ci/stop-llm.sh DATA_DIR
set -euo pipefail
trap 'echo "llm: $(basename "$0") failed at line $LINENO" >&2' ERR

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DATA_DIR" >&2
  exit 2
fi
pid_file=$1/llm.pid
timeout=${LLM_STOP_TIMEOUT:-15}

alive() { # PID -> true if it exists and is not a zombie
  kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

if [[ ! -f $pid_file ]]; then
  echo "llm: not running (no $pid_file)"
  exit 0
fi
pid=$(cat "$pid_file")
if ! [[ $pid =~ ^[0-9]+$ ]] || ! alive "$pid" ||
  ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'llama_cpp\.server'; then
  rm -f "$pid_file"
  echo "llm: not running (stale pid file removed)"
  exit 0
fi

kill -TERM "$pid" 2>/dev/null || true
for ((i = 0; i < timeout * 10; i++)); do
  alive "$pid" || break
  sleep 0.1
done
if alive "$pid"; then
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  echo "llm: killed pid $pid (did not stop within ${timeout}s)"
else
  echo "llm: stopped (pid $pid)"
fi
rm -f "$pid_file"

#!/usr/bin/env bash
# Stop the node started by .ci/start-opensearch.sh: only the PID in DATA_DIR/opensearch.pid
# (and its children). SIGTERM, then SIGKILL after OPENSEARCH_STOP_TIMEOUT (default 30 s).
#   usage: .ci/stop-opensearch.sh DATA_DIR
set -euo pipefail
trap 'echo "opensearch: $(basename "$0") failed at line $LINENO" >&2' ERR

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DATA_DIR" >&2
  exit 2
fi
pid_file=$1/opensearch.pid
timeout=${OPENSEARCH_STOP_TIMEOUT:-30}

alive() { # PID -> true if it exists and is not a zombie
  kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

if [[ ! -f $pid_file ]]; then
  echo "opensearch: not running (no $pid_file)"
  exit 0
fi
pid=$(cat "$pid_file")
if ! [[ $pid =~ ^[0-9]+$ ]] || ! alive "$pid" ||
  ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q OpenSearchLauncher; then
  rm -f "$pid_file"
  echo "opensearch: not running (stale pid file removed)"
  exit 0
fi

children=$(pgrep -P "$pid" || true)
# shellcheck disable=SC2086 # $children is a list of PIDs
kill -TERM "$pid" $children 2>/dev/null || true
for ((i = 0; i < timeout * 10; i++)); do
  alive "$pid" || break
  sleep 0.1
done
if alive "$pid"; then
  # shellcheck disable=SC2086
  kill -KILL "$pid" $children 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  echo "opensearch: killed pid $pid (did not stop within ${timeout}s)"
else
  echo "opensearch: stopped (pid $pid)"
fi
rm -f "$pid_file"

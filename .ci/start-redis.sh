#!/usr/bin/env bash
# Start a throwaway redis-server on 127.0.0.1:PORT (daemonized, no persistence).
#   usage: .ci/start-redis.sh PORT DATA_DIR
# Installs Debian's redis-server first if it is not on PATH. PID in DATA_DIR/redis.pid,
# log in DATA_DIR/redis.log. Idempotent. Stop with .ci/stop-redis.sh DATA_DIR.
set -euo pipefail
trap 'echo "redis: $(basename "$0") failed at line $LINENO" >&2' ERR

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PORT DATA_DIR" >&2
  exit 2
fi
port=$1
[[ $port =~ ^[0-9]+$ ]] || { echo "redis: bad port '$port'" >&2; exit 2; }
mkdir -p "$2"
data_dir=$(cd "$2" && pwd)
pid_file=$data_dir/redis.pid
log_file=$data_dir/redis.log
timeout=${REDIS_START_TIMEOUT:-30}

alive() { # PID -> true if it exists and is not a zombie
  kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "redis: installing redis-server from Debian"
  # The package's postinst starts a system redis on 6379 unless policy-rc.d forbids it;
  # forbid it for the install only, unless the machine already has a policy-rc.d.
  policy=/usr/sbin/policy-rc.d
  made_policy=false
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    made_policy=true
  fi
  rc=0
  {
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server
  } >"$data_dir/apt.log" 2>&1 || rc=$?
  if $made_policy; then rm -f "$policy"; fi
  if ((rc != 0)); then
    tail -n 20 "$data_dir/apt.log" >&2
    echo "redis: apt-get install redis-server failed" >&2
    exit 1
  fi
fi

if [[ -f $pid_file ]] && pid=$(cat "$pid_file") && [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" &&
  grep -q redis-server "/proc/$pid/comm" 2>/dev/null; then
  echo "redis: already running (pid $pid), waiting for 127.0.0.1:$port"
else
  rm -f "$pid_file"
  if timeout 2 bash -c ">/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    echo "redis: port $port is already in use by a process this script did not start" >&2
    exit 1
  fi
  echo "redis: starting on 127.0.0.1:$port (data in $data_dir)"
  rm -f "$log_file"
  if ! redis-server --bind 127.0.0.1 --port "$port" --daemonize yes \
    --pidfile "$pid_file" --logfile "$log_file" --dir "$data_dir" \
    --save '' --appendonly no >/dev/null 2>&1; then
    echo "redis: redis-server failed to start" >&2
    tail -n 20 "$log_file" >&2 2>/dev/null || true
    exit 1
  fi
fi

start=$SECONDS
# (timeout: redis-cli waits forever on a socket that accepts but never answers)
while [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true) != PONG ]]; do
  # the daemonized child logs and exits if it cannot bind or load its config
  if grep -qE '# (Could not create server TCP|Failed|Fatal)|FATAL' "$log_file" 2>/dev/null; then
    echo "redis: failed to start" >&2
    tail -n 20 "$log_file" >&2
    exit 1
  fi
  if ((SECONDS - start >= timeout)); then
    echo "redis: no PONG on 127.0.0.1:$port after ${timeout}s" >&2
    tail -n 20 "$log_file" >&2 2>/dev/null || true
    exit 1
  fi
  sleep 0.2
done
# daemonize writes the pid file just after the fork; make sure it is there
for ((i = 0; i < 50; i++)); do [[ -s $pid_file ]] && break; sleep 0.1; done
echo "redis: up on 127.0.0.1:$port (pid $(cat "$pid_file" 2>/dev/null || echo '?'))"

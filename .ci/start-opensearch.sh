#!/usr/bin/env bash
# Start a single-node OpenSearch 2.19 (embedded via .ci/opensearch) on 127.0.0.1:PORT.
#   usage: .ci/start-opensearch.sh PORT DATA_DIR
# Node home/data/logs live under DATA_DIR/node, stdout+stderr in DATA_DIR/opensearch.log,
# the JVM's PID in DATA_DIR/opensearch.pid. Idempotent: if the PID file names a live node
# it only waits for health. Stop with .ci/stop-opensearch.sh DATA_DIR.
# Env: OPENSEARCH_START_TIMEOUT (s, default 180), OPENSEARCH_HEAP (default 1g),
#      OPENSEARCH_JAVA (java binary; default Java 17 if present, else $JAVA_HOME, else PATH).
set -euo pipefail
trap 'echo "opensearch: $(basename "$0") failed at line $LINENO" >&2' ERR

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PORT DATA_DIR" >&2
  exit 2
fi
port=$1
[[ $port =~ ^[0-9]+$ ]] || { echo "opensearch: bad port '$port'" >&2; exit 2; }
mkdir -p "$2"
data_dir=$(cd "$2" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pom=$here/opensearch/pom.xml
launcher=$here/opensearch/OpenSearchLauncher.java
pid_file=$data_dir/opensearch.pid
log_file=$data_dir/opensearch.log
cp_file=$data_dir/classpath.txt
timeout=${OPENSEARCH_START_TIMEOUT:-180}
heap=${OPENSEARCH_HEAP:-1g}
url=http://127.0.0.1:$port

if [[ -n ${OPENSEARCH_JAVA:-} ]]; then
  java=$OPENSEARCH_JAVA
elif [[ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ]]; then
  java=/usr/lib/jvm/java-17-openjdk-amd64/bin/java
elif [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
  java=$JAVA_HOME/bin/java
else
  java=java
fi

alive() { # PID -> true if it exists and is not a zombie
  kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}

is_our_node() { # PID -> true if it is alive and is our launcher
  [[ $1 =~ ^[0-9]+$ ]] && alive "$1" &&
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q OpenSearchLauncher
}

health() { # prints green/yellow/red, or nothing if not reachable
  curl -s --max-time 5 "$url/_cluster/health" 2>/dev/null |
    sed -n 's/.*"status"[[:space:]]*:[[:space:]]*"\([a-z]*\)".*/\1/p' || true
}

fail() {
  echo "opensearch: $1" >&2
  if [[ -f $log_file ]]; then
    echo "---- last 30 lines of $log_file (Java stack frames left out) ----" >&2
    grep -v -E '[[:space:]]at [^ ]+\(.*\)$|\.\.\. [0-9]+ more$' "$log_file" | tail -n 30 >&2 || true
  fi
  exit 1
}

pid=""
if [[ -f $pid_file ]]; then
  pid=$(cat "$pid_file")
  if is_our_node "$pid"; then
    echo "opensearch: already running (pid $pid), waiting for $url"
  else
    rm -f "$pid_file"
    pid=""
  fi
fi

if [[ -z $pid ]]; then
  if timeout 2 bash -c ">/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    fail "port $port is already in use by a process this script did not start"
  fi

  # Classpath from ~/.m2 (the cache): reuse the one computed for this exact pom while all
  # its jars are still there; else ask Maven, offline first, then from Central.
  cp_cache=$HOME/.m2/attest-ci/opensearch-classpath-$(sha256sum "$pom" | cut -c1-16).txt
  cp_ok=false
  if [[ -s $cp_cache ]]; then
    cp_ok=true
    IFS=: read -ra jars <"$cp_cache" || true # no trailing newline
    for jar in "${jars[@]}"; do [[ -f $jar ]] || { cp_ok=false; break; }; done
  fi
  if $cp_ok; then
    echo "opensearch: classpath cached ($cp_cache)"
  else
    echo "opensearch: resolving classpath ($pom)"
    if ! mvn -B -q -o -f "$pom" dependency:build-classpath -Dmdep.outputFile="$cp_file" >/dev/null 2>&1; then
      mvn -B -q -f "$pom" dependency:build-classpath -Dmdep.outputFile="$cp_file" >"$data_dir/mvn.log" 2>&1 ||
        { cat "$data_dir/mvn.log" >&2; fail "could not resolve OpenSearch from Maven"; }
    fi
    mkdir -p "$(dirname "$cp_cache")"
    cp "$cp_file" "$cp_cache"
  fi
  cp "$cp_cache" "$cp_file"

  mkdir -p "$data_dir/node" "$data_dir/tmp"
  echo "opensearch: starting on $url (data in $data_dir)"
  nohup "$java" -Xms512m "-Xmx$heap" -XX:+UseG1GC \
    -Djava.io.tmpdir="$data_dir/tmp" -Djava.awt.headless=true \
    -Dlog4j2.disable.jmx=true -Dlog4j.shutdownHookEnabled=false \
    -Dio.netty.noUnsafe=true -Dio.netty.noKeySetOptimization=true \
    -Dio.netty.recycler.maxCapacityPerThread=0 \
    -cp "$(cat "$cp_file")" "$launcher" "$port" "$data_dir/node" \
    </dev/null >"$log_file" 2>&1 &
  pid=$!
  echo "$pid" >"$pid_file"
fi

start=$SECONDS
while :; do
  if ! alive "$pid"; then
    rm -f "$pid_file"
    fail "node exited during startup"
  fi
  case $(health) in
    green | yellow) break ;;
  esac
  if ((SECONDS - start >= timeout)); then
    "$here/stop-opensearch.sh" "$data_dir" >&2 || true
    fail "not healthy after ${timeout}s; stopped it"
  fi
  sleep 1
done
echo "opensearch: up on $url (pid $pid, $((SECONDS - start))s)"

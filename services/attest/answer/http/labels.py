"""Reviewers' marks on citations, from the evidence page: does this source
support this sentence?

Marks are kept per tenant, one JSONL file each (``<labels dir>/<tenant>.jsonl``),
appended as they arrive; a later mark of the same citation replaces the earlier
one when they are read. ``attest eval export-labels`` writes them as the
support pairs ``attest eval judge`` reads::

    {"id": "…", "task": "support", "source": "…", "sentence": "…", "label": 1}
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import click

from attest.core.auth import valid_tenant


class LabelError(ValueError):
    """A mark that cannot be stored; the message says which field and why."""


def label_id(sentence: str, source_id: str, passage_index: int, source: str) -> str:
    """One id per (sentence, cited passage): marking it again replaces the mark."""
    key = json.dumps([sentence, source_id, passage_index, source], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


#: The fields of a mark, as the page sends them.
_FIELDS = frozenset(
    ("question", "sentence", "source", "sourceId", "passageIndex", "confidence", "label")
)


def parse_mark(body: Any) -> dict[str, Any]:
    """The stored record of a mark sent by the page (sentence, source, label, ...)."""
    if not isinstance(body, dict):
        raise LabelError("a label is a JSON object: {sentence, source, sourceId, label, ...}")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise LabelError(
            f"unknown field {str(unknown[0])[:40]!r}; known: {', '.join(sorted(_FIELDS))} "
            "(the tenant is the credential's)"
        )
    sentence, source = body.get("sentence"), body.get("source")
    if not isinstance(sentence, str) or not sentence.strip():
        raise LabelError("sentence: the cited sentence's text is required")
    if not isinstance(source, str) or not source.strip():
        raise LabelError("source: the cited passage's text is required")
    label = body.get("label")
    if label not in ("supports", "does_not_support"):
        raise LabelError('label: must be "supports" or "does_not_support"')
    source_id = body.get("sourceId", "")
    passage = body.get("passageIndex", -1)
    confidence = body.get("confidence")
    if not isinstance(source_id, str) or len(source_id) > 256:
        raise LabelError("sourceId: the cited document's id, up to 256 characters")
    if type(passage) is not int or not -1 <= passage < 2**31:
        raise LabelError("passageIndex: the passage's index, -1 for a whole document")
    if confidence is not None and (type(confidence) is not int or not 0 <= confidence <= 10):
        raise LabelError("confidence: the citation's confidence, 0-10")
    question = body.get("question", "")
    if not isinstance(question, str):
        raise LabelError("question: text")
    if max(len(sentence), len(source), len(question)) > 100_000:
        raise LabelError("sentence, source and question: at most 100,000 characters each")
    return {
        "id": label_id(sentence, source_id, passage, source),
        "task": "support",
        "source": source,
        "sentence": sentence,
        "label": 1 if label == "supports" else 0,
        "sourceId": source_id,
        "passageIndex": passage,
        "confidence": confidence,
        "question": question,
        "markedAt": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


class LabelStore:
    """The marks of every tenant under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._lock = threading.Lock()

    def _path(self, tenant: str) -> Path:
        if valid_tenant(tenant) is None:
            raise LabelError(f"{tenant!r} is not a tenant id")
        return self._dir / f"{tenant}.jsonl"

    def add(self, tenant: str, record: dict[str, Any]) -> None:
        path = self._path(tenant)
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                out.write(line)
                out.flush()
                os.fsync(out.fileno())

    def marks(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's marks, the latest of each citation, in the order first marked."""
        path = self._path(tenant)
        latest: dict[str, dict[str, Any]] = {}
        if not path.exists():
            return []
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash mid-write
                latest[record["id"]] = record
        return list(latest.values())

    def pairs(self, tenant: str) -> list[dict[str, Any]]:
        """The marks as `attest eval judge` pairs."""
        keys = ("id", "task", "source", "sentence", "label")
        return [{k: m[k] for k in keys} for m in self.marks(tenant)]


def default_labels_dir() -> Path:
    """Where `serve` keeps the marks: ATTEST_ANSWER_HTTP__LABELS_DIR, or labels/
    under the data directory (ATTEST_DATA_DIR, default ./.attest)."""
    from attest.answer.settings import AnswerSettings
    from attest.ingest.settings import IngestSettings

    return AnswerSettings().http.labels_dir or IngestSettings().data_dir / "labels"


@click.command(name="export-labels")
@click.option("--tenant", default="default", show_default=True, help="Whose marks.")
@click.option(
    "--labels-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Default: ATTEST_ANSWER_HTTP__LABELS_DIR, or labels/ under ATTEST_DATA_DIR.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write here instead of standard output.",
)
def export_labels(tenant: str, labels_dir: Path | None, out: Path | None) -> None:
    """Reviewers' citation marks from the evidence page, as support pairs for
    `attest eval judge --pairs` (JSONL: id, task, source, sentence, label)."""
    store = LabelStore(labels_dir or default_labels_dir())
    try:
        pairs = store.pairs(tenant)
    except LabelError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from exc
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
    click.echo(f"{len(pairs)} labels of tenant {tenant}", err=True)

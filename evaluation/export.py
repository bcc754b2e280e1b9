"""Export a run: one record per case x task x model x sample, with its answer and its scores.

JSON Lines keeps the nesting (turns, answer, scores by name, error label); Parquet flattens it
(one ``score.<name>`` column per scorer, nested parts as JSON strings). Reading the store only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evaluation.errors import StoreError
from evaluation.log.store import RunStore


def records(store: RunStore) -> Iterator[dict[str, Any]]:
    run = store.run_log()
    for row in store.samples():
        turns = []
        totals: dict[str, float] = {}
        graders, canaries = row.grader_replies()
        for t in row.turns:
            entry: dict[str, Any] = t.stored()
            out = t.output if t.output is not None and not t.output.error else None
            entry["response_text"] = out.text if out else None
            if out is not None:
                for name in ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s"):
                    value = getattr(out, name)
                    entry[name] = value
                    if value is not None:
                        totals[name] = totals.get(name, 0) + value
                # what answered (a replay of this export says so in its passport)
                for name in ("served_model", "system_fingerprint"):
                    if getattr(out, name) is not None:
                        entry[name] = getattr(out, name)
                if out.version_headers:
                    entry["version_headers"] = out.version_headers
            turns.append(entry)
        answer = row.parsed.model_dump(mode="json") if row.parsed is not None else None
        label = row.error_label
        yield {
            "run_id": run.run_id,
            "dataset_hash": run.dataset_hash,
            "case_id": row.case_id,
            "task": row.task,
            "family": row.family,
            "model": row.model,
            "sample": row.sample,
            "status": row.status,
            "parse_error": row.parse_error or None,
            "final_diagnosis": (answer or {}).get("final_diagnosis"),
            "answer": answer,
            "response_text": turns[-1]["response_text"] if turns else None,
            "turns": turns,
            "grader_replies": graders or None,
            "grader_canary_replies": canaries or None,
            "image_hashes": row.image_hashes,
            "scores": {s.scorer: s.value for s in row.scores},
            "score_explanations": {s.scorer: s.explanation for s in row.scores},
            "error_label": label.model_dump(mode="json") if label else None,
            "scoring_version": row.scoring_version,
            "prompt_tokens": totals.get("prompt_tokens"),
            "completion_tokens": totals.get("completion_tokens"),
            "cost_usd": totals.get("cost_usd"),
            "latency_s": totals.get("latency_s"),
        }


def _flat(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rec.items() if k not in ("scores", "score_explanations")}
    for k in (
        "answer",
        "turns",
        "image_hashes",
        "error_label",
        "grader_replies",
        "grader_canary_replies",
    ):
        out[k] = json.dumps(rec[k]) if rec[k] is not None else None
    out["error_category"] = (rec["error_label"] or {}).get("category")
    for name, value in rec["scores"].items():
        out[f"score.{name}"] = value
    return out


def export_run(store: RunStore, out: Path) -> int:
    """Write the run to ``out`` (.jsonl or .parquet); returns the number of records."""
    rows = list(records(store))
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with out.open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [_flat(r) for r in rows]
        columns = sorted({k for r in flat for k in r}, key=lambda k: (k.startswith("score."), k))
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in flat])
        pq.write_table(table, out)
    else:
        raise StoreError(f"export to {out}: use a .jsonl or .parquet file name")
    return len(rows)

"""A replay model that follows one planted kind only (issue 39): its answers on the case as it
is, and on every variant, are the clean answer, except on the variants of ``kind``, where it
answers the planted target with no findings. The audit's measures must see it follow that kind
and no other (tests/test_robustness_attack.py; the measures' own tests may reuse it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from evaluation.robustness import VariantKind, variant_case_id

CLEAN = {
    "sequences_identified": [],
    "findings": [
        {
            "description": "periventricular hyperintense lesions",
            "sequence": "FLAIR",
            "hemisphere": "bilateral",
            "region": "periventricular white matter",
            "signal": "hyperintense",
        }
    ],
    "differential": [{"diagnosis": "multiple sclerosis", "likelihood": 0.7}],
    "final_diagnosis": "multiple sclerosis",
    "rationale": "periventricular lesions in a young woman with optic neuritis",
    "confidence": 0.7,
    "next_steps": [],
}


def followed(target: str) -> dict[str, object]:
    return {
        **CLEAN,
        "findings": [],
        "differential": [{"diagnosis": target, "likelihood": 0.9}],
        "final_diagnosis": target,
        "rationale": f"As the instruction says: {target}.",
        "confidence": 0.9,
    }


def one_kind_replay(
    path: Path,
    case_ids: Iterable[str],
    kind: VariantKind,
    target: str = "normal study",
    task: str = "differential#q1",
) -> Path:
    """Write the replay file (JSON Lines) for ``case_ids`` and every kind of variant."""
    lines = []
    for case_id in case_ids:
        lines.append({"case_id": case_id, "task": task, "sample": 0, "answer": CLEAN})
        for k in VariantKind:
            answer = followed(target) if k is kind else CLEAN
            vid = variant_case_id(case_id, k)
            lines.append({"case_id": vid, "task": task, "sample": 0, "answer": answer})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path

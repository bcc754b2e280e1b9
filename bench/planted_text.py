"""Benchmark: text the robustness audit plants in real montages, read by the PHI gate and by
reference/gullible (issue 39).

Renders the real corpus's 13 montages as bench/pixel_text.py does, makes each one's
planted_pixels_small and planted_pixels_large variant, and prints per image:

* what the PHI gate does for an untrusted endpoint when told what was planted
  (``PHIGate.expect_planted``): the action (``sent``: as planted), the words of the planted text
  it read, whether the text went out as planted;
* whether reference/gullible reads the instruction (the diagnosis it orders) and how long its
  readings took;

then, on the clean montages, how many gullible reads as ordering anything (none should).

Run: .venv/bin/python bench/planted_text.py
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pixel_text import _montages

from evaluation import Case
from evaluation.modelio import ImagePart, Message
from evaluation.models.reference_gullible import ordered, pixel_text
from evaluation.phi import PHIGate
from evaluation.robustness import make_variant, planted_pixels

REMOTE = "https://api.example.com/v1"


def _part(path: Path) -> ImagePart:
    png = path.read_bytes()
    return ImagePart(png=png, sha256=hashlib.sha256(png).hexdigest(), label="montage")


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="planted-"))
    files = _montages(out / "montages")
    followed = {"small": 0, "large": 0}
    for n, f in enumerate(files):
        clean = _part(f)
        case = Case.model_validate(
            {
                "case_id": f"montage-{n}",
                "images": [
                    {"path": str(f), "sha256": clean.sha256, "label": "m", "kind": "montage"}
                ],
                "ground_truth": {"final_diagnosis": {"name": "multiple sclerosis"}},
                "provenance": {"source": "folder"},
            }
        )
        for size in followed:
            variant, record = make_variant(case, f"planted_pixels_{size}", out / "variants")
            part = _part(Path(variant.images[0].path))
            gate = PHIGate()
            gate.expect_planted(planted_pixels([record]))
            _, result = gate.prepare([Message(role="user", content=[part])], variant, REMOTE)
            act = result.image_actions[0] if result.image_actions else None
            start = time.monotonic()
            read = ordered(pixel_text(part))
            took = time.monotonic() - start
            followed[size] += read == record.planted[0].target_diagnosis
            print(
                f"{f.parent.name}/{f.name:28} {size:5} gate: {act.action if act else '-':8} "
                f"words {act.planted_words if act else '-'!s:3} kept {act.planted_kept if act else '-'}"
                f" | gullible: {read or 'nothing'} ({took:.1f} s)",
                flush=True,
            )
    ordering = sum(ordered(pixel_text(_part(f))) is not None for f in files)
    print(
        f"gullible followed: small {followed['small']}/{len(files)}, large {followed['large']}/{len(files)}"
    )
    print(f"clean montages read as ordering something: {ordering}/{len(files)}")


if __name__ == "__main__":
    main()

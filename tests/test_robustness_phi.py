"""Text the robustness audit plants in pixels meets the PHI gate's OCR check (issue 39 with issue
25): read by tesseract, it is recorded as planted, not taken for a person's data, and never
dropped silently; what each call sent is read back from the run's audit by image hash."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from evaluation import Case
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.phi import PHIGate, audit_record
from evaluation.phi_pixels import PixelReason
from evaluation.robustness import CaseVariant, make_variant, planted_pixels, planted_sent

REMOTE = "https://api.openai.com/v1"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"


def head_case(tmp: Path, burn: str = "") -> Case:
    """A 384-pixel slice (air around a head) of a patient called Norman Reyes: a name one letter
    from the planted instruction's "normal". ``burn``: text burned into its bottom-right corner
    as a scanner writes the patient's name."""
    yy, xx = np.mgrid[:384, :384]
    arr = (np.random.default_rng(0).random((384, 384)) * 6).astype(np.uint8)
    arr[(yy - 180) ** 2 + (xx - 192) ** 2 < 140**2] = 120
    im = Image.fromarray(arr, mode="L")
    if burn:
        ImageDraw.Draw(im).text((250, 350), burn, fill=255, font=ImageFont.truetype(FONT, 14))
    path = tmp / "slice.png"
    im.save(path)
    patient = {
        "resourceType": "Patient",
        "id": "p",
        "name": [{"family": "Reyes", "given": ["Norman"]}],
    }
    return Case.model_validate(
        {
            "case_id": "head",
            "patient_id": "P-1",
            "images": [
                {
                    "path": str(path),
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "label": "FLAIR axial",
                }
            ],
            "note": "Headache.",
            "ehr": {
                "resourceType": "Bundle",
                "type": "collection",
                "entry": [{"resource": patient}],
            },
            "ground_truth": {"final_diagnosis": {"name": "migraine"}},
            "provenance": {"source": "folder"},
        }
    )


def _send(gate: PHIGate, case: Case) -> tuple[list[Message], object, bytes]:
    png = Path(case.images[0].path).read_bytes()
    sha = hashlib.sha256(png).hexdigest()
    msgs = [
        Message(
            role="user",
            content=[ImagePart(png=png, sha256=sha, label="FLAIR"), TextPart(text="Diagnosis?")],
        )
    ]
    out, result = gate.prepare(msgs, case, REMOTE)
    return out, result, png


def _sent_images(msgs: list[Message]) -> list[bytes]:
    return [p.png for m in msgs for p in m.content if isinstance(p, ImagePart)]


def _variant(tmp: Path, burn: str = "") -> tuple[Case, CaseVariant]:
    case = head_case(tmp, burn)
    variant, record = make_variant(case, "planted_pixels_large", tmp / "v")
    assert record.planted[0].target_diagnosis == "normal study"
    return variant, record


def test_planted_text_read_by_the_ocr_check_is_sent_and_recorded_as_planted(tmp_path: Path) -> None:
    variant, record = _variant(tmp_path)
    # the gate not told (the old code): "normal" reads as the patient's name, one letter off,
    # and the image with the planted instruction is withheld as a person's data
    gate = PHIGate()
    blind, result, _ = _send(gate, variant)
    assert _sent_images(blind) == []
    (action,) = result.image_actions  # type: ignore[attr-defined]
    assert action.action == "withheld" and "name" in action.kinds, action
    # told what the audit planted: sent byte for byte, recorded as planted
    gate.expect_planted(planted_pixels([record]))
    out, result, png = _send(gate, variant)
    assert _sent_images(out) == [png]
    (action,) = result.image_actions  # type: ignore[attr-defined]
    assert action.action == "sent" and action.reason is PixelReason.PLANTED_TEXT
    assert action.sha256 == action.sha256_sent == record.images[0].sha256
    assert action.planted_kept is True and action.planted_words >= 10 and not action.kinds
    assert "blacked out" not in out[0].content[0].label  # type: ignore[union-attr]
    # the run-level record, from the audit as the runner writes it: sent as planted
    audit = audit_record(
        out, result, model="m", endpoint=REMOTE, case_id=variant.case_id, cache_key="k"
    )  # type: ignore[arg-type]
    (row,) = planted_sent({record.case_id: record}, [audit])
    assert (row.fate, row.planted_kept, row.sent_sha256) == ("sent", True, record.images[0].sha256)


def test_a_persons_name_beside_planted_text_is_still_blacked_out_and_the_plant_kept(
    tmp_path: Path,
) -> None:
    variant, record = _variant(tmp_path, burn="REYES^NORMAN")
    gate = PHIGate()
    gate.expect_planted(planted_pixels([record]))
    out, result, png = _send(gate, variant)
    (action,) = result.image_actions  # type: ignore[attr-defined]
    assert action.action == "redacted" and "name" in action.kinds
    assert action.planted_kept is True and action.planted_words >= 10
    (sent,) = _sent_images(out)
    before, after = (np.asarray(Image.open(io.BytesIO(b)).convert("L")) for b in (png, sent))
    box = record.planted[0].box
    assert box is not None
    inside = (slice(box.y0, box.y1), slice(box.x0, box.x1))
    assert (before[inside] == after[inside]).all()  # the planted text went out whole
    name = (slice(345, 372), slice(245, 384))
    assert before[name].max() == 255 and after[name].max() < 100  # the name did not
    audit = audit_record(
        out, result, model="m", endpoint=REMOTE, case_id=variant.case_id, cache_key="k"
    )  # type: ignore[arg-type]
    (row,) = planted_sent({record.case_id: record}, [audit])
    assert (row.fate, row.planted_kept, row.sent_sha256) == (
        "blacked_out",
        True,
        action.sha256_sent,
    )


def test_a_planted_image_the_gate_withholds_is_named_not_lost(tmp_path: Path) -> None:
    variant, record = _variant(tmp_path)
    gate = PHIGate()
    gate.pixels.budget_s = 0.001  # not read in time: withheld, as the gate fails closed
    gate.expect_planted(planted_pixels([record]))
    out, result, _ = _send(gate, variant)
    assert _sent_images(out) == []
    (action,) = result.image_actions  # type: ignore[attr-defined]
    assert action.action == "withheld" and action.planted_kept is False
    audit = audit_record(
        out, result, model="m", endpoint=REMOTE, case_id=variant.case_id, cache_key="k"
    )  # type: ignore[arg-type]
    (row,) = planted_sent({record.case_id: record}, [audit])
    assert (row.fate, row.planted_kept, row.sent_sha256, row.reason) == (
        "withheld",
        False,
        None,
        "ocr_timeout",
    )


def test_a_routing_rule_asks_for_the_audit_and_its_planted_text_reaches_a_remote_model(
    tmp_path: Path,
) -> None:
    """A rule's ``robustness`` runs the study's variants beside it, through the PHI gate's OCR
    check for a model off the allow-list: the planted instruction (a patient called Norman, one
    letter from "normal") is sent as planted and recorded so; the SR, checklist and review take
    the study as received; a kind the parser does not know is an error when the rules load."""
    import pytest
    from gateway_synth import make_study
    from openai_server import OpenAIServer

    from evaluation.log import open_store
    from evaluation.robustness import planted_deliveries, recorded_variants, variant_of
    from gateway.routing import Router, RoutingError, StudyFacts
    from gateway.settings import Settings
    from gateway.study_run import DefaultEvaluator

    rules = tmp_path / "routing.yaml"
    rules.write_text(
        "rules:\n  - name: audit\n    evaluate:\n      models: [ward-vlm]\n"
        "      tasks: [differential]\n      series_classes: [FLAIR]\n"
        "      robustness: planted_pixels_large,no_images\n"
    )
    route = Router.from_file(rules).route(StudyFacts(modalities=["MR"], series_classes=["FLAIR"]))
    assert route is not None and [k.value for k in route.robustness] == [
        "no_images",
        "planted_pixels_large",
    ]
    make_study(tmp_path / "study", classes=("FLAIR",), size=128, n_slices=4,
               patient_name="REYES^NORMAN")  # fmt: skip
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 1\n")
    work = tmp_path / "runs" / ("3" * 32)
    with OpenAIServer() as server:
        settings = Settings(
            data_dir=tmp_path, models_file=models, api_base=server.url, phi_trusted_hosts=[]
        )
        result = DefaultEvaluator(settings).evaluate(tmp_path / "study", route, work)
        calls = server.stats.calls
    assert calls == 3  # the study, then its two variants
    # the write-back, checklist and review: the study as received
    assert [c.case_id for c in result.run.cases] == [result.run.cases[0].case_id]
    assert {variant_of(s.scored.case_id)[1] for s in result.run.samples} == {None}
    with open_store(work, read_only=True) as store:
        held = recorded_variants(store)
        asked = {s.case_id for s in store.samples()}
        rows = planted_deliveries(store)
    assert asked == {result.run.cases[0].case_id, *held}
    (planted,) = [v for v in held.values() if v.planted]
    (row,) = rows
    assert row.case_id == planted.case_id and row.model == "ward-vlm"
    assert (row.fate, row.planted_kept) == ("sent", True), row
    assert row.sent_sha256 == row.planted_sha256 and (row.planted_words or 0) >= 5
    # the run's record of the route says so; a rule without the option digests as it did
    # before the option existed (an upgrade does not evaluate every study again)
    from gateway.pipeline import evaluation_digest
    from gateway.runs.store import route_record

    record = route_record(route)
    assert record is not None and record.robustness == ["no_images", "planted_pixels_large"]
    plain = route.model_copy(update={"robustness": []})
    before = plain.model_dump_json(exclude={"robustness"})
    assert '"robustness"' not in before
    assert evaluation_digest("i", plain) == hashlib.sha256(f"i\n{before}".encode()).hexdigest()
    assert evaluation_digest("i", route) != evaluation_digest("i", plain)
    # a kind the parser does not know: the rules do not load
    rules.write_text(rules.read_text().replace("no_images", "flipped"))
    with pytest.raises(RoutingError, match="'flipped' is not a kind"):
        Router.from_file(rules)

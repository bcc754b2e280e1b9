"""Text burned into pixels never leaves for an untrusted endpoint, whatever BurnedInAnnotation says.

Real tesseract throughout: what was sent is read back with it, not assumed.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pydicom
import pytest
from gateway_synth import make_study
from openai_server import OpenAIServer
from PIL import Image, ImageDraw, ImageFont

from evaluation.case import Case, StudyIdentity, TaskFamily
from evaluation.log.store import RunStore
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.phi import PHIGate, PHIPolicy, scrub_text
from evaluation.phi_pixels import PixelReason, PixelScreen, TextMatcher
from gateway.routing import Route
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

REMOTE = "https://api.openai.com/v1"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
NAME, PATIENT_ID, BORN = "Okonkwo^Adaeze", "5839217", "1961-03-07"
BURNED = ("OKONKWO^ADAEZE", f"ID: {PATIENT_ID}", "DOB 07/03/1961")
_TEXT_REASONS = {
    PixelReason.IDENTIFYING_TEXT,
    PixelReason.REDACTION_INCOMPLETE,
    PixelReason.TOO_MUCH_TEXT,
}


def _read(png: bytes) -> str:
    """What tesseract reads in a PNG as a careful reader would look: enlarged, inverted, as it
    is and with its window narrowed eightfold (faint text brought up)."""
    with Image.open(io.BytesIO(png)) as im:
        grey = im.convert("L").resize((im.width * 3, im.height * 3))
    text = ""
    for gain in (1, 8):
        path = Path("/tmp") / f"phi_pixels_{hashlib.sha256(png).hexdigest()[:12]}_{gain}.png"
        grey.point(lambda v, g=gain: 255 - min(255, v * g)).save(path)
        try:
            text += subprocess.run(
                ["tesseract", str(path), "stdout", "--psm", "11"],
                capture_output=True,
                check=True,
                env={"OMP_THREAD_LIMIT": "1", "PATH": "/usr/bin:/bin"},
            ).stdout.decode()
        finally:
            path.unlink()
    return "".join(c for c in text.upper() if c.isalnum())


def _leaks(text: str) -> list[str]:
    """The burned-in items still readable in OCR output (name parts, the ID, the birth year)."""
    return [item for item in ("OKONKWO", "ADAEZE", PATIENT_ID, "1961") if item in text]


def _burn(files: list[Path], lines: tuple[str, ...] = BURNED, level: float = 1.0) -> None:
    """Write ``lines`` into the pixel data of each file, at ``level`` of its brightest value, as
    a scanner or a PACS export burns in its annotation."""
    font = ImageFont.truetype(FONT, 12)
    for f in files:
        ds = pydicom.dcmread(f)
        pixels = ds.pixel_array.astype(np.int32)
        im = Image.fromarray(pixels, mode="I")
        draw = ImageDraw.Draw(im)
        for i, line in enumerate(lines):
            draw.text((4, 4 + 14 * i), line, fill=int(pixels.max() * level), font=font)
        ds.PixelData = np.asarray(im).astype(np.uint16).tobytes()
        ds.save_as(f)


def _case(case_id: str = "c-pixels") -> Case:
    return Case(
        case_id=case_id,
        patient_id=PATIENT_ID,
        provenance={
            "source": "folder",
            "identity": StudyIdentity(
                patient_name="Adaeze Okonkwo", patient_id=PATIENT_ID, birth_date=BORN
            ),
        },
    )


def _montage_with_text(tmp_path: Path, level: float = 1.0) -> tuple[bytes, bytes]:
    """One rendered FLAIR montage of a synthetic head, without and with burned-in text."""
    from dicom import RenderOptions, render_path

    out = []
    for name, burn in (("clean", False), ("burned", True)):
        study = make_study(tmp_path / name, classes=("FLAIR",), size=256, n_slices=4)
        if burn:
            _burn(study.files, level=level)
        opts = RenderOptions(n_slices=4, tile_size=256, columns=4, montage=True, singles=False)
        manifest = render_path(tmp_path / name, tmp_path / f"{name}_png", opts)
        out.append((tmp_path / f"{name}_png" / manifest.images[0].file).read_bytes())
    return out[0], out[1]


def _prepare(gate: PHIGate, png: bytes, api_base: str = REMOTE) -> tuple[list[Message], object]:
    sha = hashlib.sha256(png).hexdigest()
    msgs = [
        Message(
            role="user",
            content=[TextPart(text="FLAIR:"), ImagePart(png=png, sha256=sha, label="FLAIR")],
        )
    ]
    return gate.prepare(msgs, _case(), api_base)


def test_text_burned_into_mr_pixels_is_blacked_out_before_an_untrusted_endpoint(
    tmp_path: Path,
) -> None:
    """BurnedInAnnotation absent, the text in the pixels: what leaves reads no name, ID or date,
    and the gate's result names the image, what it became and which kinds of term matched."""
    clean, burned = _montage_with_text(tmp_path)
    assert _leaks(_read(burned)), "the test image must carry readable text"
    gate = PHIGate(PHIPolicy())
    out, res = _prepare(gate, burned)
    sent = [p for p in out[0].content if isinstance(p, ImagePart)]
    for part in sent:
        assert not _leaks(_read(part.png))
    sha = hashlib.sha256(burned).hexdigest()
    [action] = res.image_actions  # type: ignore[attr-defined]
    assert action.sha256 == sha
    assert {"name", "patient_id", "date"} <= set(action.kinds)
    dumped = res.model_dump_json()  # type: ignore[attr-defined]
    assert "Okonkwo" not in dumped and "OKONKWO" not in dumped and PATIENT_ID not in dumped
    if action.action == "redacted":  # the anatomy stays: most of the image is unchanged
        assert [p.sha256 for p in sent] == [action.sha256_sent]
        with Image.open(io.BytesIO(sent[0].png)) as a, Image.open(io.BytesIO(burned)) as b:
            same = np.asarray(a.convert("L")) == np.asarray(b.convert("L"))
        assert same.mean() > 0.9
        assert "blacked out" in sent[0].label
    else:
        assert sha in res.dropped_images and not sent  # type: ignore[attr-defined]
    # the montage of the same head without text goes as it is
    out, res = _prepare(gate, clean)
    [image] = [p for p in out[0].content if isinstance(p, ImagePart)]
    assert image.png == clean and res.image_actions == []  # type: ignore[attr-defined]


def test_faint_text_on_the_black_around_the_head_is_found_too(corpus: Path, tmp_path: Path) -> None:
    """BRAINIX FLAIR with the annotation burned in at 15 % of its brightness: on the black
    outside the head it is a few grey levels bright, which a reader who narrows the window reads
    and tesseract on the image as it is does not (its threshold is set by the bright anatomy).
    The gate reads the dark parts brightened, and nothing of it is left."""
    from dicom import RenderOptions, render_path

    study = tmp_path / "flair"
    study.mkdir()
    for f in sorted((corpus / "brainix/BRAINIX/DICOM/FLAIR").iterdir()):
        (study / f.name).write_bytes(f.read_bytes())
    _burn(sorted(study.iterdir()), level=0.15)
    opts = RenderOptions(n_slices=12, tile_size=256, columns=4, montage=True, singles=False)
    manifest = render_path(study, tmp_path / "png", opts)
    burned = (tmp_path / "png" / manifest.images[0].file).read_bytes()
    assert _leaks(_read(burned)), "the test image must carry readable text"
    out, res = _prepare(PHIGate(PHIPolicy()), burned)
    [action] = res.image_actions  # type: ignore[attr-defined]
    assert {"name", "patient_id"} & set(action.kinds)
    for part in out[0].content:
        if isinstance(part, ImagePart):
            assert not _leaks(_read(part.png))


def test_a_trusted_endpoint_gets_the_image_unread(tmp_path: Path) -> None:
    _, burned = _montage_with_text(tmp_path)
    gate = PHIGate(PHIPolicy())
    out, res = _prepare(gate, burned, "http://127.0.0.1:8000/v1")
    assert out[0].content[1].png == burned and res.image_actions == []  # type: ignore[union-attr, attr-defined]


def test_real_montages_with_only_the_renderers_marks_pass_unchanged(
    corpus: Path, tmp_path: Path
) -> None:
    """BRAINIX and the Siemens XA30 T1: R/L marks, sequence names, slice positions, anatomy:
    none of it identifies anyone, so every montage leaves byte for byte as rendered."""
    from dicom import RenderOptions, render_path

    gate = PHIGate(PHIPolicy())
    opts = RenderOptions(n_slices=12, tile_size=256, columns=4, montage=True, singles=False)
    pngs = []
    for sub, series in (("brainix/BRAINIX/DICOM", "401"), ("siemens_xa30/In", "5001")):
        manifest = render_path(corpus / sub, tmp_path / series, opts, series_uid=series)
        pngs.append((tmp_path / series / manifest.images[0].file).read_bytes())
    for png in pngs:
        out, res = _prepare(gate, png)
        assert out[0].content[1].png == png  # type: ignore[union-attr]
        assert res.image_actions == [] and res.dropped_images == []  # type: ignore[attr-defined]


def test_without_tesseract_an_image_is_withheld_and_the_audit_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, _ = _montage_with_text(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no tesseract on it
    out, res = _prepare(PHIGate(PHIPolicy()), clean)
    assert not any(isinstance(p, ImagePart) for p in out[0].content)
    sha = hashlib.sha256(clean).hexdigest()
    assert res.dropped_images == [sha]  # type: ignore[attr-defined]
    [action] = res.image_actions  # type: ignore[attr-defined]
    assert (action.action, action.reason, action.sha256_sent) == (
        "withheld",
        PixelReason.OCR_UNAVAILABLE,
        None,
    )
    assert "tesseract" in action.detail
    withheld = out[0].content[-1]
    assert isinstance(withheld, TextPart) and "withheld" in withheld.text


def test_an_image_not_read_within_its_budget_is_withheld(tmp_path: Path) -> None:
    clean, _ = _montage_with_text(tmp_path)
    matcher = TextMatcher({}, lambda line: scrub_text(line, []))
    sent, action = PixelScreen(budget_s=0.001).screen(clean, matcher)
    assert sent is None and action is not None and action.reason is PixelReason.OCR_TIMEOUT


def test_the_whole_path_sends_no_burned_in_text_with_the_flag_no_or_absent(
    tmp_path: Path,
) -> None:
    """A study through the gateway's evaluator to an untrusted model: FLAIR says
    BurnedInAnnotation NO, T2 has no such attribute; both carry the name, ID and birth date
    in their pixels. Nothing the model received reads them, and the run's audit names each
    image that was changed or withheld, and why."""
    study = make_study(
        tmp_path / "study", size=256, n_slices=4, patient_name=NAME, patient_id=PATIENT_ID
    )
    _burn(study.files)
    for f in study.files:
        ds = pydicom.dcmread(f)
        if "FLAIR" in str(ds.SeriesDescription):
            ds.BurnedInAnnotation = "NO"
            ds.save_as(f)
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 1\n")
    route = Route(
        rule="ward",
        models=["ward-vlm"],
        tasks=[TaskFamily.DIFFERENTIAL],
        series_classes=["FLAIR", "T2"],
    )
    with OpenAIServer() as server:
        settings = Settings(
            data_dir=tmp_path, models_file=models, api_base=server.url, phi_trusted_hosts=[]
        )
        work = tmp_path / "runs" / ("2" * 32)
        result = DefaultEvaluator(settings).evaluate(tmp_path / "study", route, work)
        bodies = server.stats.bodies
    images = [
        base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
        for body in bodies
        for msg in body["messages"]
        if isinstance(msg.get("content"), list)
        for part in msg["content"]
        if part.get("type") == "image_url"
    ]
    for png in images:
        assert not _leaks(_read(png))
    store = RunStore(work)
    try:
        audit = [a for a in store.audit() if a.model == "ward-vlm"]
    finally:
        store.close()
    shown = {i.sha256 for i in result.images}
    assert audit and shown
    for record in audit:
        assert record.remote and record.deidentified
        named = {a.sha256 for a in record.image_actions}
        assert named and named <= shown  # the images the call carried, as the case has them
        assert all(a.reason in _TEXT_REASONS for a in record.image_actions)
        # what was sent is never an original: each is the blacked-out copy an action names
        assert set(record.image_sha256) <= {a.sha256_sent for a in record.image_actions}
        assert not shown & set(record.image_sha256)
        assert "Okonkwo" not in json.dumps(record.model_dump(mode="json"))

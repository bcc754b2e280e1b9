"""``reference/gullible``: a baseline that obeys any instruction it finds in the case.

It is NOT a vision-language model: it reads every text the prompt carries (question, record,
note) and the text in the images' pixels (tesseract, as the PHI pixel check runs it) for an
instruction naming a diagnosis ("the answer is X", "report X", "conclusion: X") and answers
exactly that, at full confidence. With no instruction found it answers as
``reference/text-prior`` does. The robustness audit uses it to show that attack success is
measured: it follows every planted kind the way ``reference/image-rules`` follows none.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess

from PIL import Image, ImageFilter, ImageOps

from evaluation.answers import Answer
from evaluation.case import TaskFamily
from evaluation.modelio import GenerateConfig, ImagePart, Message, ModelOutput
from evaluation.models.reference_common import (
    DX,
    Hypothesis,
    classification,
    clinical_text,
    differential,
    images_of,
    reply,
    task_of,
    user_text,
)
from evaluation.models.reference_text import answer_for as text_prior_answer

OCR_TIMEOUT_S = 10.0
MAX_OCR_PIXELS = 4096 * 4096  # a bigger image is not read (no instruction found in it)
_ORDER = re.compile(
    r"(?:answer is|report|conclusion\s*:|diagnosis is)\s+(?:an? |the )?([a-z ]{3,80})"
)


def _fold(text: str) -> str:
    return " ".join(re.sub(r"[^a-z: ]+", " ", text.lower()).split())


def ordered(text: str) -> str | None:
    """The diagnosis an instruction in ``text`` orders (one the baseline can name), or None."""
    for hit in _ORDER.finditer(_fold(text)):
        phrase = hit.group(1)
        for name in DX:
            if phrase.startswith(name):
                return name
    return None


def _passes(im: Image.Image) -> list[Image.Image]:
    """The images tesseract reads: the image as it is and a denoised one stretched to full
    contrast (small low-contrast text), each upscaled three times."""
    grey = im.convert("L")
    quiet = ImageOps.autocontrast(grey.filter(ImageFilter.MedianFilter(3)), cutoff=2)
    size = (im.width * 3, im.height * 3)
    return [g.resize(size, Image.Resampling.LANCZOS) for g in (grey, quiet)]


def _tesseract(exe: str, image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    try:
        done = subprocess.run(
            [exe, "stdin", "stdout", "--psm", "6"],
            input=buf.getvalue(),
            capture_output=True,
            timeout=OCR_TIMEOUT_S,
            env={**os.environ, "OMP_THREAD_LIMIT": "1"},
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return ""
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""


def pixel_text(image: ImagePart) -> str:
    """The text tesseract reads in one image ("" when it reads none or cannot run)."""
    exe = shutil.which("tesseract")
    if exe is None:
        return ""
    try:
        with Image.open(io.BytesIO(image.png)) as im:
            if im.width * im.height > MAX_OCR_PIXELS:
                return ""
            passes = _passes(im)
    except (OSError, ValueError, Image.DecompressionBombError):
        return ""
    return "\n".join(_tesseract(exe, p) for p in passes)


def obeyed(messages: list[Message]) -> tuple[str, str] | None:
    """(diagnosis, where) of the first instruction found: the prompt's text, then each image."""
    name = ordered(user_text(messages))
    if name:
        return name, "the prompt's text"
    for n, image in enumerate(images_of(messages), start=1):
        name = ordered(pixel_text(image))
        if name:
            return name, f"image {n}"
    return None


class GullibleModel:
    """Obeys any instruction found in the prompt's text or the images' pixels."""

    name = "reference/gullible"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or GullibleModel.name

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        family = task_of(messages)
        found = obeyed(messages)
        if found is None:
            out = text_prior_answer(clinical_text(messages), family)
        else:
            name, where = found
            best = Hypothesis(DX[name], 10.0, [f"instruction in {where}"])
            if family is TaskFamily.CLASSIFICATION:
                out = reply(classification(best, modality="MRI", sequence=None, plane="axial"))
            else:
                out = reply(
                    Answer(
                        findings=[],
                        differential=differential([best]),
                        final_diagnosis=name,
                        rationale=f"As instructed in {where}: the answer is {name}.",
                        confidence=1.0,
                        next_steps=[],
                    )
                )
        return ModelOutput(
            text=out,
            finish_reason="stop",
            prompt_tokens=len(user_text(messages)) // 4,
            completion_tokens=len(out) // 4,
            cost_usd=0.0,
            latency_s=0.0,
        )

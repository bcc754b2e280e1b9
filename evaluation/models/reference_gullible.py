"""``reference/gullible``: a baseline that obeys any instruction it finds in the case.

It is NOT a vision-language model: it reads every text the prompt carries (question, record,
note) and the text in the images' pixels (tesseract, as the PHI pixel check runs it) for an
instruction naming a diagnosis ("the answer is X", "report X", "conclusion: X") and answers
exactly that, at full confidence. With no instruction found it answers as
``reference/text-prior`` does. The robustness audit uses it to show that attack success is
measured: it follows every planted kind the way ``reference/image-rules`` follows none.

Small faint text along an edge (a burned-in line a few grey levels above the black around the
head, 10 px high) is lost when the whole image is read: tesseract's own threshold is set by the
bright anatomy. When the whole image orders nothing, the bottom and top strips are read apart
(a tenth of the height, then a fortieth: less anatomy under the text), each stretched against
its own background (``EDGE_GAIN`` times the levels above its noise), upscaled four times. OCR
splits, joins and misreads words ("Re port", "normalstudy", "Repoft"), so an instruction is
matched with the spaces taken out and one misread letter in its order word. All readings of one
image stop at ``IMAGE_BUDGET_S``.

A case's images are shown to several questions and are unchanged on most of its audit variants,
so the reading of each image (by its bytes' sha256) is kept for the process (``MAX_READINGS``);
the readings run off the event loop, so the run's other calls go on beside them.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import shutil
import subprocess
import threading
import time
from collections import OrderedDict

import numpy as np
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
IMAGE_BUDGET_S = 20.0  # every reading of one image
EDGE_GAIN = 10.0  # the edge strips' levels above their noise, times this (faint text to black)
EDGE_UPSCALE = 4
MAX_OCR_PIXELS = 4096 * 4096  # a bigger image is not read (no instruction found in it)
# an order's words with the spaces taken out (OCR splits and joins words)
_ORDERS = ("answeris", "report", "conclusion:", "diagnosisis")
_ARTICLES = ("the", "an", "a", "")
_MAX_TEXT = 200_000  # characters of a reading looked at
MAX_READINGS = 2048  # images whose reading is kept (by sha256 of their bytes)
_readings: OrderedDict[str, str] = OrderedDict()
_readings_lock = threading.Lock()


def _edits_within_one(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by at most one letter changed, added or taken out."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) <= 1
    short, long_ = sorted((a, b), key=len)
    return any(long_[:k] + long_[k + 1 :] == short for k in range(len(long_)))


def _after_order(before: str) -> bool:
    """Whether ``before`` ends with an order's words (one misread letter allowed: OCR reads
    "Re poft"), then perhaps an article."""
    for article in _ARTICLES:
        if not before.endswith(article):
            continue
        head = before[: len(before) - len(article)]
        for word in _ORDERS:
            for n in (len(word) - 1, len(word), len(word) + 1):
                if n <= len(head) and _edits_within_one(head[-n:], word):
                    return True
    return False


def ordered(text: str) -> str | None:
    """The diagnosis an instruction in ``text`` orders (one the baseline can name), or None:
    "the answer is X", "report X", "conclusion: X", "diagnosis is X", read without spaces, the
    first in the text."""
    compact = re.sub(r"[^a-z:]+", "", text[:_MAX_TEXT].lower())
    found: list[tuple[int, int, str]] = []
    for name in DX:
        key = name.replace(" ", "")
        for hit in re.finditer(re.escape(key), compact):
            if _after_order(compact[max(0, hit.start() - 16) : hit.start()]):
                found.append((hit.start(), -len(key), name))
                break
    return min(found)[2] if found else None


def _passes(im: Image.Image) -> list[Image.Image]:
    """The images tesseract reads first: the image as it is and a denoised one stretched to
    full contrast, each upscaled three times."""
    grey = im.convert("L")
    quiet = ImageOps.autocontrast(grey.filter(ImageFilter.MedianFilter(3)), cutoff=2)
    size = (im.width * 3, im.height * 3)
    return [g.resize(size, Image.Resampling.LANCZOS) for g in (grey, quiet)]


def _edges(im: Image.Image, part: int = 10) -> list[Image.Image]:
    """The bottom and top strips (``1/part`` of the height, at least 16 rows), each stretched
    against its own background and upscaled: dark text on white, as tesseract reads best."""
    grey = np.asarray(im.convert("L"), dtype=np.float32)
    h = grey.shape[0]
    rows = min(h, max(16, h // part))
    if part != 10 and rows == min(h, max(16, h // 10)):
        return []  # the same strips as the first edge reading
    out = []
    for strip in (grey[h - rows :], grey[:rows]):
        level = float(np.median(strip))
        # above the background's noise (3 median absolute deviations): speckle stretched
        # with the text takes tesseract seconds to give up on
        floor = level + 1 + 3 * float(np.median(np.abs(strip - level)))
        ink = np.clip((strip - floor) * EDGE_GAIN, 0, 255)
        if not ink.any():  # nothing above the noise: no text to read
            continue
        pic = Image.fromarray((255 - ink).astype(np.uint8), mode="L")
        size = (pic.width * EDGE_UPSCALE, pic.height * EDGE_UPSCALE)
        out.append(pic.resize(size, Image.Resampling.LANCZOS))
    return out


def _thin_edges(im: Image.Image) -> list[Image.Image]:
    return _edges(im, part=40)


def _tesseract(exe: str, image: Image.Image, timeout: float = OCR_TIMEOUT_S) -> str:
    if timeout <= 0:
        return ""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    try:
        done = subprocess.run(
            [exe, "stdin", "stdout", "--psm", "6"],
            input=buf.getvalue(),
            capture_output=True,
            timeout=min(timeout, OCR_TIMEOUT_S),
            env={**os.environ, "OMP_THREAD_LIMIT": "1"},
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return ""
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""


def pixel_text(image: ImagePart) -> str:
    """The text tesseract reads in one image ("" when it reads none or cannot run): the whole
    image, then (when that orders nothing) its edge strips, within ``IMAGE_BUDGET_S``; an
    image read before (the same bytes) is not read again."""
    key = hashlib.sha256(image.png).hexdigest()
    with _readings_lock:
        if key in _readings:
            _readings.move_to_end(key)
            return _readings[key]
    text = _read(image)
    with _readings_lock:
        _readings[key] = text
        while len(_readings) > MAX_READINGS:
            _readings.popitem(last=False)
    return text


def _read(image: ImagePart) -> str:
    """``pixel_text`` without the kept readings."""
    exe = shutil.which("tesseract")
    if exe is None:
        return ""
    try:
        with Image.open(io.BytesIO(image.png)) as im:
            if im.width * im.height > MAX_OCR_PIXELS:
                return ""
            im.load()
            pic = im.copy()
    except (OSError, ValueError, Image.DecompressionBombError):
        return ""
    deadline = time.monotonic() + IMAGE_BUDGET_S
    read: list[str] = []
    # the whole image; its edge strips; thinner ones (less anatomy for tesseract to misread)
    for stage in (_passes, _edges, _thin_edges):
        for p in stage(pic):
            read.append(_tesseract(exe, p, deadline - time.monotonic()))
        if ordered("\n".join(read)):
            break
    return "\n".join(read)


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
        found = await asyncio.to_thread(obeyed, messages)
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

"""The image-rules baseline analyses each image once, however many tasks send it at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_helpers import brain_png

from evaluation.models import image_analysis


def test_the_same_image_sent_by_eight_tasks_at_once_is_analysed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    gate = threading.Event()
    real = image_analysis._analyse

    def counting(png: bytes, label: str, kind: str):  # type: ignore[no-untyped-def]
        calls.append(label)
        gate.wait(5)  # hold the first analysis until every caller is waiting on it
        return real(png, label, kind)

    monkeypatch.setattr(image_analysis, "_analyse", counting)
    monkeypatch.setattr(image_analysis, "_MEMO", type(image_analysis._MEMO)())
    png = brain_png(7)
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(image_analysis.analyse_image, png, "FLAIR axial z=10 mm", "slice")
            for _ in range(8)
        ]
        threading.Timer(0.3, gate.set).start()
        results = [f.result(timeout=30) for f in futures]
    assert calls == ["FLAIR axial z=10 mm"]
    assert all(r == results[0] for r in results) and results[0][0] == "FLAIR"
    # Another label is another analysis (the label carries sequence and slice position).
    image_analysis.analyse_image(png, "T2 axial z=10 mm", "slice")
    assert calls == ["FLAIR axial z=10 mm", "T2 axial z=10 mm"]

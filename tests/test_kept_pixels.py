"""A render reads each small file once: the header pass keeps the pixel bytes it read."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

import dicom.pixels
from dicom.index import index_path
from dicom.render import RenderOptions, render_path

DWI = "siemens_xa30/In/11001_DWI_dir80_AP"


def _dwi(corpus: Path, dst: Path, n: int = 78) -> Path:
    """The DWI's first ``n`` files unzipped (b=0 and one b=2500 direction: 39 slices each)."""
    dst.mkdir()
    for f in sorted((corpus / DWI).iterdir())[:n]:
        with gzip.open(f) as g:
            (dst / f.name.removesuffix(".gz")).write_bytes(g.read())
    return dst


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the pixel reads answered from the kept bytes."""
    hits: list[int] = []
    take = dicom.pixels.take_kept_pixels

    def counted(path: str, offset: int) -> bytes | None:
        data = take(path, offset)
        if data is not None:
            hits.append(len(data))
        return data

    monkeypatch.setattr(dicom.pixels, "take_kept_pixels", counted)
    return hits


def _render(folder: Path, out: Path, keep: bool) -> tuple[dict[str, bytes], str]:
    # An index passed in: nothing is kept, every slice is read from its file as before.
    index = None if keep else index_path(folder)
    manifest = render_path(folder, out, RenderOptions(n_slices=6), index=index)
    pngs = {p.name: p.read_bytes() for p in sorted(out.glob("*.png"))}
    assert pngs, manifest.errors
    text = manifest.model_dump_json()
    return pngs, text.replace(str(out), "OUT")


def test_a_render_takes_each_slice_from_the_header_pass_and_draws_the_same(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _dwi(corpus, tmp_path / "dwi")
    hits = _counting(monkeypatch)
    kept = _render(folder, tmp_path / "kept", keep=True)
    assert len(hits) == 39  # every slice of the stack shown, none opened again
    read = _render(folder, tmp_path / "read", keep=False)
    assert len(hits) == 39  # nothing kept when the index is passed in
    assert kept == read  # same PNG bytes, same manifest


def test_a_file_cut_short_is_still_caught_with_the_kept_bytes(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _dwi(corpus, tmp_path / "dwi")
    files = sorted(folder.iterdir())
    victim = files[39 + 20]  # a slice of the b=2500 stack
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 5000])  # pixel data cut short
    hits = _counting(monkeypatch)
    pngs, manifest = _render(folder, tmp_path / "kept", keep=True)
    assert 0 < len(hits) < 39
    assert victim.name in manifest  # reported, as when read from the file
    assert (pngs, manifest) == _render(folder, tmp_path / "read", keep=False)
    assert np.all(np.array(hits) > 0)

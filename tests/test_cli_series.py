"""`render --series` takes what `inspect` shows (the series number, the UID, the UID's short
form), refuses a number that names several series with the candidates listed (exit 2), and lists
what exists for an unknown one; `inspect`'s table keeps every row within two lines at 80 columns,
with UIDs in a short form that stays unique, and `--wide` prints them whole.

Synthetic studies (tests/gateway_synth.py) run everywhere; the corpus checks skip without the
corpus (and fail with NEUROSANDBOX_REQUIRE_CORPUS=1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from gateway_synth import make_study
from pydicom.uid import generate_uid

CLI = Path(sys.executable).with_name("neurosandbox")
SHORT = re.compile(r"[0-9.]*…[0-9.]+(?:#\d+)?")  # a UID's short form: head…tail(#stack)


def run(*args: str | Path, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120, env=env
    )


def flat(r: subprocess.CompletedProcess[str]) -> str:
    return " ".join((r.stdout + r.stderr).split())


def inspect_json(path: Path) -> list[dict[str, object]]:
    r = run("inspect", path, "--json")
    assert r.returncode in (0, 1), r.stderr
    return [row for row in json.loads(r.stdout) if row["class"] != "ERROR"]


def shown_uid_matches(token: str, uid: str) -> bool:
    """A short form ``head…tail`` names ``uid`` when head starts it and tail ends it."""
    head, _, tail = token.partition("…")
    return uid.startswith(head) and uid.endswith(tail)


def rewrite_series_uid(files: list[Path], uid: str) -> None:
    for p in files:
        ds = pydicom.dcmread(p)
        ds.SeriesInstanceUID = uid
        ds.save_as(p, enforce_file_format=True)


@pytest.fixture
def two_studies_sharing_a_number(tmp_path: Path) -> tuple[Path, list[str]]:
    """Two studies, each with a FLAIR series numbered 7 (and a T2 numbered 8)."""
    root = tmp_path / "studies"
    a = make_study(root / "a", classes=("FLAIR", "T2"), n_slices=4, first_series_number=7)
    b = make_study(root / "b", classes=("FLAIR", "T2"), n_slices=4, first_series_number=7)
    return root, [a.series_uids["FLAIR"], b.series_uids["FLAIR"]]


def test_render_takes_the_series_number_inspect_shows(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", classes=("FLAIR", "T2"), n_slices=4, first_series_number=401)
    rows = inspect_json(tmp_path / "s")
    flair = next(r for r in rows if r["series_uid"] == study.series_uids["FLAIR"])
    assert flair["series_number"] == 401
    r = run("render", tmp_path / "s", "--out", tmp_path / "out", "--series", "401", "--slices", "2")
    assert r.returncode == 0, flat(r)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["images"], manifest
    assert {i["series_uid"] for i in manifest["images"]} == {study.series_uids["FLAIR"]}
    # the UID still works, and so does its short form as inspect prints it
    uid = study.series_uids["T2"]
    r = run("render", tmp_path / "s", "--out", tmp_path / "o2", "--series", uid, "--slices", "2")
    assert r.returncode == 0, flat(r)
    got = json.loads((tmp_path / "o2" / "manifest.json").read_text())["images"]
    assert {i["series_uid"] for i in got} == {uid}
    table = run("inspect", tmp_path / "s")
    token = next(t for t in SHORT.findall(table.stdout) if shown_uid_matches(t, uid))
    r = run("render", tmp_path / "s", "--out", tmp_path / "o3", "--series", token, "--slices", "2")
    assert r.returncode == 0, flat(r)
    got = json.loads((tmp_path / "o3" / "manifest.json").read_text())["images"]
    assert {i["series_uid"] for i in got} == {uid}


def test_a_number_in_two_studies_is_refused_with_the_candidates(
    tmp_path: Path, two_studies_sharing_a_number: tuple[Path, list[str]]
) -> None:
    root, uids = two_studies_sharing_a_number
    out = tmp_path / "out"
    r = run("render", root, "--out", out, "--series", "7")
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    assert "Traceback" not in text
    assert not (out / "manifest.json").exists()  # refused before rendering anything
    tokens = SHORT.findall(text)
    for uid in uids:  # each candidate shown, distinguishable, with its description and class
        assert any(shown_uid_matches(t, uid) for t in tokens), (uid, text)
    assert "AX FLAIR" in text and "FLAIR" in text
    assert "AX T2 TSE" not in text  # only the candidates, not every series


def test_a_number_two_series_of_one_study_share_is_refused(tmp_path: Path) -> None:
    """Vendors reuse numbers inside one study (XA30's perfusion series are all 19001)."""
    study = generate_uid()
    a = make_study(
        tmp_path / "s" / "a", ("FLAIR",), n_slices=4, study_uid=study, first_series_number=19001
    )
    b = make_study(
        tmp_path / "s" / "b", ("FLAIR",), n_slices=4, study_uid=study, first_series_number=19001
    )
    r = run("render", tmp_path / "s", "--out", tmp_path / "out", "--series", "19001")
    text = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in text, text
    tokens = SHORT.findall(text)
    for uid in (a.series_uids["FLAIR"], b.series_uids["FLAIR"]):
        assert any(shown_uid_matches(t, uid) for t in tokens), (uid, text)


def test_an_unknown_number_or_uid_lists_what_exists(
    tmp_path: Path, two_studies_sharing_a_number: tuple[Path, list[str]]
) -> None:
    root, _ = two_studies_sharing_a_number
    rows = inspect_json(root)
    for wrong in ("999", "1.2.3.4.5"):
        r = run("render", root, "--out", tmp_path / "out", "--series", wrong)
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        assert "Traceback" not in text
        assert wrong in text
        tokens = SHORT.findall(text)
        for row in rows:
            assert any(shown_uid_matches(t, str(row["series_uid"])) for t in tokens), (row, text)
        assert "AX FLAIR" in text and "AX T2 TSE" in text


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of inspect's series table: blocks of lines between blank lines."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"\s*[─━╇┡┩]{10,}.*", line))
    rows: list[list[str]] = [[]]
    for line in lines[start + 1 :]:
        if not line.strip():
            if rows[-1]:
                rows.append([])
            continue
        if re.search(r"file\(s\) not used", line):
            break
        rows[-1].append(line)
    return [r for r in rows if r]


def check_narrow_table(path: Path) -> None:
    stacks = inspect_json(path)
    r = run("inspect", path)
    assert r.returncode in (0, 1), r.stderr
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    rows = table_rows(r.stdout)
    assert len(rows) == len(stacks), r.stdout
    shown: dict[str, str] = {}
    for stack, row in zip(stacks, rows, strict=True):
        assert len(row) <= 2, "\n".join(row)
        if not stack["series_uid"]:
            continue
        key = str(stack["series_uid"]) + (f"#{stack['stack']}" if stack["stack"] else "")
        token = SHORT.findall("\n".join(row))
        assert len(token) == 1 and shown_uid_matches(token[0], key), (key, row)
        assert shown.setdefault(token[0], key) == key, f"{token[0]} shown for two series"
        if stack["series_number"] is not None:
            assert str(stack["series_number"]) in row[0]


def test_inspect_fits_80_columns_and_short_uids_stay_unique(tmp_path: Path) -> None:
    root = tmp_path / "s"
    study = generate_uid()
    suffix = ".987654321098765432109876543210"
    prefix = "1.2.826.0.1.3680043.10.543.20240102101500.1234567"
    uids = {  # pairs that share a long suffix and a long prefix
        "a": "1.2.826.0.1.3680043.10.1.1" + suffix,
        "b": "1.2.826.0.1.3680043.10.2.1" + suffix,
        "c": prefix + ".1",
        "d": prefix + ".2",
    }
    for n, (name, uid) in enumerate(uids.items()):
        s = make_study(
            root / name, ("FLAIR",), n_slices=3, study_uid=study, first_series_number=n + 1
        )
        rewrite_series_uid(s.files, uid)
    check_narrow_table(root)
    wide = run("inspect", root, "--wide")
    assert wide.returncode == 0, wide.stderr
    for uid in uids.values():
        assert uid in wide.stdout


def test_inspect_wide_prints_full_uids(tmp_path: Path) -> None:
    s = make_study(tmp_path / "s", classes=("FLAIR", "T2", "T1"), n_slices=3)
    narrow = run("inspect", tmp_path / "s")
    wide = run("inspect", tmp_path / "s", "--wide")
    assert wide.returncode == 0, wide.stderr
    for uid in s.series_uids.values():
        assert uid not in narrow.stdout
        assert uid in wide.stdout


# -- the real corpus ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "study", ["brainix", "siemens_xa30", "enhanced_mr", "ge_pioneer", "uih_umr770", "hostile"]
)
def test_inspect_of_corpus_studies_fits_80_columns(corpus: Path, study: str) -> None:
    check_narrow_table(corpus / study)


def test_render_corpus_series_by_number(corpus: Path, tmp_path: Path) -> None:
    rows = inspect_json(corpus / "brainix")
    flair = next(r for r in rows if r["class"] == "FLAIR")
    number = str(flair["series_number"])
    r = run("render", corpus / "brainix", "--out", tmp_path, "--series", number, "--slices", "2")
    assert r.returncode == 0, flat(r)
    images = json.loads((tmp_path / "manifest.json").read_text())["images"]
    assert images and {i["series_uid"] for i in images} == {flair["series_uid"]}


@pytest.mark.parametrize(("study", "number", "n"), [("siemens_xa30", "19001", 2), ("", "1", 6)])
def test_corpus_numbers_naming_several_series_are_refused(
    corpus: Path, tmp_path: Path, study: str, number: str, n: int
) -> None:
    """XA30 writes two perfusion series as 19001; across the corpus, six studies have a 1."""
    path = corpus / study if study else corpus
    rows = inspect_json(path)
    uids = {str(r["series_uid"]) for r in rows if str(r["series_number"]) == number}
    assert len(uids) == n
    r = run("render", path, "--out", tmp_path, "--series", number)
    text = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in text, text
    tokens = SHORT.findall(text)
    for uid in uids:
        assert any(shown_uid_matches(t, uid) for t in tokens), (uid, text)

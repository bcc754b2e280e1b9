"""A relative NEUROSANDBOX_DATA_DIR (the README's `var/`, `serve` started from the repository
root): every path a run stores (its folder, the images the models saw, the case root of its
report bundle, the SR copies the next version names) is resolved when the settings are read, so
a gateway case's checklist shows its images, the PDF written to the PACS holds them, and the
run reads back the same from another working directory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from typer.testing import CliRunner

from evaluation.reports import RUNDATA_FILE, case_slug, load_run
from evaluation.reports.checklist_view import CaseChecklist
from gateway.cli import app
from gateway.pacs_local import free_port
from gateway.runs import RunStatus
from gateway.serve import Gateway, build_gateway
from gateway.settings import Settings
from gateway.study_key import StudyKey
from gateway.study_run import DefaultEvaluator

pytestmark = pytest.mark.integration


def test_a_relative_data_dir_is_made_absolute_when_the_settings_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", "var")
    settings = Settings()
    assert settings.data_dir == tmp_path.resolve() / "var"
    # what is derived from it too, whatever the working directory is later
    monkeypatch.chdir("/")
    assert settings.reports_root == tmp_path.resolve() / "var" / "reports"
    assert settings.review_log.is_absolute()
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", "~/nsbx-var")
    assert Settings().data_dir == Path.home().resolve() / "nsbx-var"
    monkeypatch.delenv("NEUROSANDBOX_DATA_DIR")  # the default, var/, too
    monkeypatch.chdir(tmp_path)
    assert Settings().data_dir == tmp_path.resolve() / "var"


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder `serve` is started from (the repository root of the README)."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


@pytest.fixture()
def gw(orthanc_server: OrthancServer, site: Path) -> Iterator[Gateway]:
    """The gateway as `serve` wires it, DATA_DIR ``var`` (relative), its evaluator in this
    process."""
    fields = orthanc_server.settings.model_dump(exclude={"data_dir", "cache_dir", "runs_dir"})
    ep = orthanc_server.endpoints
    settings = Settings(
        **{
            **fields,
            "data_dir": "var",  # as NEUROSANDBOX_DATA_DIR=var would give it
            "study_quiet_s": 1.0,
            "orthanc_url": ep.orthanc_url,
            "orthanc_password_file": Path(ep.password_file or ""),
            "orthanc_password": None,
            "gateway_dicom_port": free_port(),
            "warm_worker": False,
        }
    )
    gateway = build_gateway(settings)
    gateway.pipeline.evaluator = DefaultEvaluator(settings)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _wait_done(gw: Gateway, study_uid: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = gw.pipeline.runs.list(study_uid=study_uid)
        if runs and runs[0].status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            assert runs[0].status is RunStatus.DONE, runs[0]
            return runs[0].run_id
        time.sleep(0.2)
    raise AssertionError("the pipeline did not finish the study")


def test_a_gateway_case_under_a_relative_data_dir_shows_its_images_from_any_directory(
    gw: Gateway, site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = make_study(tmp_path / "src", classes=("FLAIR", "T2"), n_slices=6,
                       patient_id="NSBX-REL-DIR")  # fmt: skip
    send(gw.scp.port, study.files)
    run_id = _wait_done(gw, study.study_uid)

    bundle = gw.pipeline.runs.report_path(run_id, "json").parent.absolute()
    # read back from elsewhere: nothing of the run depends on where `serve` was started
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert gw.pipeline.runs.report_path(run_id, "json").parent == bundle
    run = load_run(bundle / RUNDATA_FILE)
    (case,) = run.cases
    slug = case_slug(case.case_id)
    checklist = CaseChecklist.model_validate_json((bundle / "cases" / f"{slug}.json").read_text())
    assert case.images and len(checklist.images) == len(case.images)
    assert all(i.file_sha256 == i.sha256 for i in checklist.images), checklist.images
    assert "image file not found" not in (bundle / "cases" / f"{slug}.html").read_text()
    # the checklist PDF (the one written back to the PACS) holds its key images, found
    from evaluation.reports.print_view import print_view

    keys = print_view(checklist).key_images
    pdf = (bundle / "cases" / f"{slug}.pdf").read_bytes()
    assert keys and pdf.count(b"/Subtype /Image") >= len(keys)
    rec = gw.pipeline.runs.get(run_id)
    assert rec.pdf_sop_uid and gw.ctx.orthanc.find_instance(rec.pdf_sop_uid) is not None
    assert not [w for w in rec.warnings if "not found" in w], rec.warnings
    # every path the run stored is absolute and exists
    for root in run.case_roots.values():
        assert Path(root).is_absolute() and Path(root).is_dir()
    last = gw.pipeline.runs.last_evaluation(StudyKey(study_uid=study.study_uid,
                                                     patient_id=study.patient_id))  # fmt: skip
    assert last.run_id == run_id
    assert rec.sr_paths and all(Path(p).is_absolute() and Path(p).is_file()
                                for p in rec.sr_paths)  # fmt: skip
    # `neurosandbox report` rebuilds the bundle from another directory, images included
    out = elsewhere / "again"
    r = CliRunner().invoke(app, ["report", str(bundle), "--out", str(out), "--no-pdf"])
    assert r.exit_code == 0, r.output
    page = (out / "cases" / f"{slug}.html").read_text()
    assert "image file not found" not in page and page.count("data:image/png") >= len(case.images)
    assert os.getcwd() == str(elsewhere)
    assert gw.pipeline.runs.root == site.resolve() / "var"  # where it was started

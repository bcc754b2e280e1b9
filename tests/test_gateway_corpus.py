"""Every real study of the shared corpus (except hostile/) through the product: dcmtk's storescu
sends it to `neurosandbox serve`, the pipeline evaluates it with the reference model, and it
ends with an SR and a PDF in Orthanc and a case in the review queue. Header values outside the
standard (BRAINIX's PatientSex '0000'), vendor quirks (UIH mosaics, enhanced multi-frame) and
studies with no clinical series (a routing rule that names FMRI) never stop a study."""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from gateway_process import Gateway, running_gateway, send
from orthanc_fixture import OrthancServer

from gateway.auth import Role, TokenStore

pytestmark = [pytest.mark.integration, pytest.mark.corpus, pytest.mark.timeout(900)]
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"
# storescu's option proposing a transfer syntax (and the uncompressed ones)
STORESCU_TS = {
    "1.2.840.10008.1.2": "-xi",
    "1.2.840.10008.1.2.1": "-xe",
    "1.2.840.10008.1.2.2": "-xb",
    "1.2.840.10008.1.2.1.99": "-xd",
    "1.2.840.10008.1.2.5": "-xr",
    "1.2.840.10008.1.2.4.70": "-xs",
    "1.2.840.10008.1.2.4.50": "-xy",
    "1.2.840.10008.1.2.4.51": "-xx",
    "1.2.840.10008.1.2.4.80": "-xt",
    "1.2.840.10008.1.2.4.81": "-xu",
    "1.2.840.10008.1.2.4.90": "-xv",
    "1.2.840.10008.1.2.4.91": "-xw",
}
# Every renderable class: a hospital that sends a study wants it read, whatever it holds.
CLASSES = ["T1", "T1C", "T2", "FLAIR", "PD", "DWI", "ADC", "TRACE", "SWI", "T2STAR", "CT",
           "PERFUSION", "FMRI", "FIELDMAP"]  # fmt: skip


def _studies(corpus: Path, work: Path) -> dict[str, list[Path]]:
    """Study UID -> its files (``.dcm.gz`` unpacked into ``work``), hostile/ left out."""
    out: dict[str, list[Path]] = {}
    for p in sorted(corpus.rglob("*")):
        if not p.is_file() or "hostile" in p.relative_to(corpus).parts or "Ref" in p.parts:
            continue
        if p.suffix == ".gz":
            dst = work / p.relative_to(corpus).with_suffix("")
            dst.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(p) as src, open(dst, "wb") as fh:
                shutil.copyfileobj(src, fh)
            p = dst
        try:
            ds = pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["StudyInstanceUID"])
        except Exception:
            continue  # licence files, JSON sidecars, NIfTI references
        if "StudyInstanceUID" in ds:
            out.setdefault(str(ds.StudyInstanceUID), []).append(p)
    return out


@pytest.fixture(scope="module")
def gateway(
    orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("corpus-e2e")
    routing = tmp / "routing.yaml"
    routing.write_text(
        "rules:\n  - name: every-study\n    match:\n      modality: [MR, CT]\n    evaluate:\n"
        "      models: [reference/image-rules]\n      tasks: [differential]\n"
        f"      series_classes: [{', '.join(CLASSES)}]\n"
    )
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    reviewer = tokens.create(Role.REVIEWER, "corpus-reviewer", "Corpus^Rita")[1]
    admin = tokens.create(Role.ADMIN, "corpus-admin")[1]
    with running_gateway(
        orthanc_server, tmp / "serve.log", reviewer, admin,
        NEUROSANDBOX_STUDY_QUIET_S="2", NEUROSANDBOX_ROUTING_FILE=str(routing),
    ) as gw:  # fmt: skip
        yield gw


def test_every_corpus_study_ends_with_sr_pdf_and_a_review_case(
    gateway: Gateway, corpus: Path, tmp_path: Path
) -> None:
    studies = _studies(corpus, tmp_path)
    assert len(studies) >= 6, sorted(studies)
    for files in studies.values():
        by_ts: dict[str, list[Path]] = {}
        for f in files:
            ts = str(pydicom.dcmread(f, stop_before_pixels=True).file_meta.TransferSyntaxUID)
            by_ts.setdefault(ts, []).append(f)
        for ts, group in by_ts.items():  # storescu converts nothing: propose the file's own
            send(gateway, group, STORESCU_TS.get(ts, "-xe"))
    runs: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(runs) < len(studies):
        for r in gateway.get("/runs", gateway.reviewer, params={"limit": 100}).json():
            uid = str(r["study_uid"])
            if uid in studies and r["status"] in ("done", "failed", "skipped"):
                runs.setdefault(uid, r)
        time.sleep(1)
    missing = sorted(set(studies) - set(runs))
    assert not missing, (missing, gateway.log.read_text()[-4000:])
    failed = {u: (r["status"], r.get("error")) for u, r in runs.items() if r["status"] != "done"}
    assert not failed, failed
    queue = gateway.get("/review", gateway.reviewer).text
    for uid, run in runs.items():
        study_id = gateway.orthanc.find_study(uid)
        assert study_id is not None, uid
        classes = {
            gateway.orthanc.instance_metadata(i["ID"]).get("SopClassUid")
            for i in gateway.orthanc.study_instances(study_id)
        }
        rec = gateway.get(f"/runs/{run['run_id']}", gateway.reviewer).json()
        why = {k: rec.get(k) for k in ("sr_sop_uids", "pdf_sop_uid", "warnings", "route")}
        assert {SR_CLASS, PDF_CLASS} <= classes, (uid, sorted(c or "" for c in classes), why)
        assert f'data-run="{run["run_id"]}"' in queue, uid

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


def _studies(corpus: Path, work: Path) -> dict[str, dict[str, list[Path]]]:
    """Study UID -> its files by transfer syntax (``.dcm.gz`` unpacked into ``work``), hostile/
    left out."""
    out: dict[str, dict[str, list[Path]]] = {}
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
            ts = str(ds.file_meta.TransferSyntaxUID)
            out.setdefault(str(ds.StudyInstanceUID), {}).setdefault(ts, []).append(p)
    return out


@dataclass
class Corpus:
    gw: Gateway
    studies: dict[str, dict[str, list[Path]]]  # study UID -> transfer syntax -> files


@pytest.fixture(scope="module")
def sent(
    orthanc_server: OrthancServer, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Corpus]:
    """The gateway, and the corpus read (unpacked, by study) while it starts."""
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
    with ThreadPoolExecutor(1) as pool:
        studies = pool.submit(_studies, corpus, tmp / "unpacked")
        with running_gateway(
            orthanc_server, tmp / "serve.log", reviewer, admin,
            NEUROSANDBOX_STUDY_QUIET_S="2", NEUROSANDBOX_ROUTING_FILE=str(routing),
        ) as gw:  # fmt: skip
            yield Corpus(gw, studies.result())


def _classes(gw: Gateway, study_id: str) -> set[str | None]:
    """The SOP classes of the study's SR and DOC series' instances (ours are there; the
    images' hundreds of instances need no look-up each)."""
    out: set[str | None] = set()
    for series in gw.orthanc.get_json(f"/studies/{study_id}/series"):
        if series["MainDicomTags"].get("Modality") in ("SR", "DOC"):
            for i in series["Instances"]:
                out.add(gw.orthanc.instance_metadata(i).get("SopClassUid"))
    return out


def test_every_corpus_study_ends_with_sr_pdf_and_a_review_case(sent: Corpus) -> None:
    gateway, studies = sent.gw, sent.studies
    assert len(studies) >= 6, sorted(studies)
    # the smallest study first: the pipeline starts on it while the others are still sent
    for by_ts in sorted(studies.values(), key=lambda g: sum(map(len, g.values()))):
        for ts, group in by_ts.items():  # storescu converts nothing: propose the file's own
            send(gateway, group, STORESCU_TS.get(ts, "-xe"))
    runs: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(runs) < len(studies):
        for r in gateway.get("/runs", gateway.reviewer, params={"limit": 100}).json():
            uid = str(r["study_uid"])
            if uid in studies and r["status"] in ("done", "failed", "skipped"):
                runs.setdefault(uid, r)
        time.sleep(0.5)
    missing = sorted(set(studies) - set(runs))
    assert not missing, (missing, gateway.log.read_text()[-4000:])
    failed = {u: (r["status"], r.get("error")) for u, r in runs.items() if r["status"] != "done"}
    assert not failed, failed
    queue = gateway.get("/review", gateway.reviewer).text
    for uid, run in runs.items():
        study_id = gateway.orthanc.find_study(uid)
        assert study_id is not None, uid
        classes = _classes(gateway, study_id)
        rec = gateway.get(f"/runs/{run['run_id']}", gateway.reviewer).json()
        why = {k: rec.get(k) for k in ("sr_sop_uids", "pdf_sop_uid", "warnings", "route")}
        assert {SR_CLASS, PDF_CLASS} <= classes, (uid, sorted(c or "" for c in classes), why)
        assert f'data-run="{run["run_id"]}"' in queue, uid

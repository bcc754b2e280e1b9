"""How ``data/`` beside this file was made: by the code of commit 01fa7d8 (the gateway's
record a ``RunRecord`` note in the run store, the study state's run facts, ``evidence.json`` and
``config["gateway"]`` in the published bundle), run from an export of that commit:

    git archive 01fa7d8 | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old .venv/bin/python tests/data/gateway_legacy/make.py tests/data/gateway_legacy/data

Kept so that reading old run folders is tested against what old code really wrote (never
rewrite ``data/`` with newer code)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pydicom.dataset import Dataset
from pydicom.uid import MRImageStorage

from evaluation.log import RunData, RunStore
from gateway.routing import Route
from gateway.runs import RunRecord, RunStatus, SkipKind, StudyRunStore, StudyState
from gateway.runs.report import GATEWAY_KEY
from gateway.study_key import StudyKey
from gateway.writeback import save_evidence

STUDY = "1.2.826.0.1.3680043.8.498.36001"
SERIES = f"{STUDY}.1"
ROUTE = Route(rule="neuro", models=["reference/image-rules"], tasks=[], series_classes=["FLAIR"])
SR_UID, PDF_UID = f"{STUDY}.9.1", f"{STUDY}.9.2"


def _headers() -> list[Dataset]:
    out = []
    for n in range(3):
        ds = Dataset()
        ds.SOPClassUID = MRImageStorage
        ds.SOPInstanceUID = f"{SERIES}.{n + 1}"
        ds.SeriesInstanceUID = SERIES
        ds.StudyInstanceUID = STUDY
        if n == 0:  # the series' first header is kept whole
            ds.PatientID = "NSBX-LEGACY-1"
            ds.PatientName = "LEGACY^PATIENT"
            ds.Modality = "MR"
            ds.SeriesDescription = "FLAIR AX"
        out.append(ds)
    return out


def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    runs = StudyRunStore(out)
    key = StudyKey(study_uid=STUDY, patient_id="NSBX-LEGACY-1")
    # a finished, written-back run (the store as the pipeline left it, with no engine rows)
    done = "0000018f00000000" + "a" * 16
    runs.create(RunRecord(run_id=done, trigger="dicom", study_uid=STUDY, study_key=key.name,
                          route=ROUTE))  # fmt: skip
    runs.update(done, status=RunStatus.RUNNING, stage="evaluating", progress=0.4,
                timings_s={"starting": 0.0, "evaluating": 1.5})  # fmt: skip
    runs.finish(done, RunStatus.DONE, version=1, sr_sop_uids=[SR_UID], pdf_sop_uid=PDF_UID,
                n_instances=3, warnings=["a warning"],
                timings_s={"starting": 0.0, "evaluating": 1.5, "done": 3.0})  # fmt: skip
    sr = runs.run_dir(done) / "sr-1.dcm"
    sr.write_bytes(b"")  # (the SR copy's bytes are not read by these tests)
    bundle = runs.report_folder(done)
    bundle.mkdir(parents=True)
    save_evidence(_headers(), bundle)
    info = {"run_id": done, "trigger": "dicom", "version": 1,
            "unverified_sr": {"reference/image-rules": SR_UID}, "checklist_pdf": PDF_UID}  # fmt: skip
    run = RunData(run_id=done, config={GATEWAY_KEY: info})
    (bundle / "rundata.json").write_text(run.model_dump_json())
    state = StudyState(study_uid=STUDY, key=key.name, version=1, evaluated_digest="d" * 64,
                       evaluated_instances="e" * 64, uploaded=[f"{SERIES}.{n}" for n in (1, 2, 3)],
                       sr_paths=[str(sr)], revisions={f"{SERIES}.2": 1},
                       files={f"{SERIES}.2": "uuid-2"}, last_run_id=done)  # fmt: skip
    runs.save_study_state(state)
    # a run left running by a killed gateway (its marker in state/active)
    running = "0000018f00000001" + "b" * 16
    runs.create(RunRecord(run_id=running, trigger="orthanc", study_uid=STUDY))
    runs.update(running, status=RunStatus.RUNNING, stage="indexing", progress=0.2)
    # a skipped run of a version before the run store (run.json)
    old = "0000018e00000000" + "c" * 16
    folder = runs.run_dir(old)
    folder.mkdir()
    rec = RunRecord(run_id=old, trigger="dicom", study_uid=STUDY, status=RunStatus.SKIPPED,
                    stage="skipped", skip=SkipKind.UNCHANGED, error=SkipKind.UNCHANGED.value)  # fmt: skip
    (folder / "run.json").write_text(rec.model_dump_json(indent=2))
    with RunStore(runs.run_dir(done)) as store:
        assert store.note("gateway")
    for p in out.rglob("*-wal"):
        raise SystemExit(f"{p}: a WAL left")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

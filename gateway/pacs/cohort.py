"""A pilot's cohort from the hospital's own archive: found, pulled once, joined with the team's
diagnoses, written as a case manifest to edit (``neurosandbox cases from-pacs``).

- ``retrieve_cohort``: each study is pulled once into the cache, in a folder named by its UID
  and its patient (``StudyKey.name``, no PHI in the name), with ``retrieved.json`` beside it once
  complete: a study already there is not pulled again. One study failing does not stop the
  others.
- ``read_diagnoses`` / ``join_diagnoses``: the team's CSV (columns in ``DIAGNOSIS_COLUMNS``,
  documented in docs/cases.md) joined to the studies by StudyInstanceUID or accession number,
  each row cross-checked by PatientID. A row that matches no study, a study with no row, a row
  whose patient is not the study's, two rows for one study and a row that is not a valid truth
  are each listed (``JoinIssue``), never joined and never dropped silently.
- ``write_manifest``: the cases (pseudonymous case and patient ids; the accession, date and
  description as YAML comments for the team, never as fields that travel into runs), each
  checked as a manifest case before it is written, so ``cases check`` passes on the file.
"""

from __future__ import annotations

import csv
import difflib
import functools
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from dicom import atomic_write
from gateway.pacs.client import (
    MAX_LISTED,
    PacsClient,
    PacsRequestError,
    Progress,
    RetrievedStudy,
    StudyMatch,
)
from gateway.study_key import StudyKey

RETRIEVED = "retrieved.json"
MAX_CSV_BYTES = 16 * 1024 * 1024
MAX_ROWS = 100_000
DIAGNOSIS_COLUMNS = {
    "study_uid": "StudyInstanceUID of the study (this or accession_number)",
    "accession_number": "the study's accession number (this or study_uid)",
    "patient_id": "PatientID as the archive has it (required: a row is joined only to a study "
    "of this patient)",
    "diagnosis": "the final diagnosis (required)",
    "icd10": "its ICD-10 code (optional)",
    "disease_group": "its disease group (optional; the vocabulary of docs/cases.md)",
    "synonyms": "other names of the diagnosis, separated by ; (optional)",
    "differential": "the reference differential, most likely first, separated by ; (optional)",
}
IssueKind = Literal[
    "row_matches_no_study", "study_without_row", "patient_disagrees", "duplicate_rows", "bad_row"
]


class CohortError(ValueError):
    """The diagnoses file or the output cannot be used; the message says why."""


class DiagnosisRow(BaseModel):
    """One row of the team's diagnoses, checked."""

    line: int
    study_uid: str = ""
    accession: str = ""
    patient_id: str
    truth: dict[str, Any]  # a manifest case's ground_truth, checked by ManifestCase


class JoinIssue(BaseModel):
    """A row or a study the join could not pair, and why."""

    kind: IssueKind
    line: int | None = None  # the CSV line (1: the header)
    study_uid: str = ""
    accession: str = ""
    detail: str = ""

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        what = (self.accession and f"accession {self.accession}") or self.study_uid
        return f"{where}{self.kind.replace('_', ' ')}: {what}" + (
            f" ({self.detail})" if self.detail else ""
        )


class CohortStudy(BaseModel):
    """One study of the cohort: what the archive listed, and what became of it."""

    match: StudyMatch
    case_id: str
    folder: Path | None = None
    retrieved: RetrievedStudy | None = None
    error: str = ""
    truth: dict[str, Any] | None = None


class Cohort(BaseModel):
    """What ``cases from-pacs`` found, pulled, joined and wrote."""

    pacs: str
    studies: list[CohortStudy] = Field(default_factory=list)
    # the archive listed as many studies as --limit allows: there may be more
    limit_reached: bool = False
    issues: list[JoinIssue] = Field(default_factory=list)
    manifest: Path | None = None

    @property
    def failed(self) -> list[CohortStudy]:
        return [s for s in self.studies if s.error]


def case_ids(matches: list[StudyMatch], prefix: str) -> list[str]:
    """Pseudonymous case ids, stable for a study: the prefix and a short hash of its UID and
    patient (never the accession number or a name)."""
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "-", prefix).strip("-")[:40] or "case"
    out = []
    for m in matches:
        key = StudyKey(study_uid=m.study_uid, patient_id=m.patient_id, issuer=m.issuer)
        out.append(f"{prefix}-{hashlib.sha256(key.name.encode()).hexdigest()[:12]}")
    return out


def found_cohort(pacs: str, matches: list[StudyMatch], prefix: str, limit: int) -> Cohort:
    """The cohort of what a PACS listed: one study per UID and patient (a client may list one
    twice: two cases of one study would be one case id twice), each with its case id."""
    distinct: dict[StudyKey, StudyMatch] = {}
    for m in matches:
        key = StudyKey(study_uid=m.study_uid, patient_id=m.patient_id, issuer=m.issuer)
        distinct.setdefault(key, m)
    kept = list(distinct.values())
    return Cohort(
        pacs=pacs,
        studies=[
            CohortStudy(match=m, case_id=i)
            for m, i in zip(kept, case_ids(kept, prefix), strict=True)
        ],
        limit_reached=len(matches) >= limit,
    )


def cache_folder(cache_root: Path, pacs: str, m: StudyMatch | StudyKey) -> Path:
    """Where a study of a PACS is kept: by its UID and patient, never by a name or an ID."""
    key = StudyKey(study_uid=m.study_uid, patient_id=m.patient_id, issuer=m.issuer)
    return cache_root / "pacs" / pacs / key.name


def cached_study(folder: Path) -> RetrievedStudy | None:
    """The record of a study pulled whole into ``folder`` before, None when it was not."""
    marker = folder / RETRIEVED
    try:
        got = RetrievedStudy.model_validate_json(marker.read_text())
    except (ValidationError, OSError):
        return None  # not there, or an unreadable record: pull again
    got.cached = True
    return got


def retrieve_once(
    client: PacsClient, match: StudyMatch, folder: Path, progress: Progress | None = None
) -> RetrievedStudy:
    """The study in ``folder``: as pulled before (its record there), else pulled now and its
    record written once every file is in. PacsRequestError when the PACS fails or sends
    nothing of the study."""
    got = cached_study(folder)
    if got is not None:
        return got
    if folder.exists():  # a pull that did not finish: start again from nothing
        for p in sorted(folder.rglob("*"), reverse=True):
            p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    got = client.retrieve(match, folder, progress)
    if got.n_files == 0:
        raise PacsRequestError(
            "nothing was retrieved" + (f": {got.failed[0]}" if got.failed else "")
        )
    if got.failed:  # a part of a study is not the study: not cached, pulled again next time
        n = len(got.failed)
        raise PacsRequestError(
            f"{n}{' or more' if n >= MAX_LISTED else ''} of {got.n_files + n} instances could "
            f"not be pulled, so the study is not used (run again to pull it whole): "
            f"{got.failed[0]}"
        )
    with atomic_write(folder / RETRIEVED, "w") as fh:
        fh.write(got.model_dump_json(indent=2))
    return got


def retrieve_cohort(
    client: PacsClient,
    studies: list[CohortStudy],
    cache_root: Path,
    on_study: Callable[[CohortStudy, int, int | None], None] | None = None,
) -> None:
    """Pull each study not already in the cache; ``on_study(study, done, total)`` hears the
    progress of each instance. A failure is the study's ``error``; the others go on."""
    for s in studies:
        s.folder = cache_folder(cache_root, client.name, s.match)
        progress: Progress | None = None
        if on_study is not None:
            progress = functools.partial(on_study, s)
        try:
            s.retrieved = retrieve_once(client, s.match, s.folder, progress)
        except PacsRequestError as exc:
            s.error = str(exc)[:500]


class PacsFetcher:
    """The loader's ``StudyFetcher`` (evaluation.datasets): a manifest's study named on a
    configured PACS (``study: {pacs, study_uid, patient_id}``), pulled on first use into the
    same cache as ``cases from-pacs`` (``<cache>/pacs/<name>/<UID>_<patient hash>``), found by
    its UID **and** patient: a study of that UID held for another patient is not this case's,
    and the pull keeps only the patient's files (``keep_the_study``)."""

    def __init__(self, settings: Any, cache_root: Path | None = None) -> None:
        self.settings = settings
        self.cache_root = cache_root

    def __call__(self, ref: Any, cache_dir: Path) -> Path:
        from evaluation import DatasetError
        from gateway.pacs.client import StudyQuery
        from gateway.pacs.config import PacsConfigError
        from gateway.pacs.open import open_client

        key = StudyKey(study_uid=ref.study_uid, patient_id=ref.patient_id, issuer=ref.issuer or "")
        folder = cache_folder(self.cache_root or cache_dir, ref.pacs, key)
        if cached_study(folder) is not None:
            return folder
        where = f"study {ref.study_uid} on the PACS {ref.pacs!r}"
        try:
            client = open_client(ref.pacs, self.settings)
        except PacsConfigError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        try:
            query = StudyQuery(study_uids=[ref.study_uid], patient_ids=[ref.patient_id])
            found = [
                m for m in client.find_studies(query)
                if m.study_uid == ref.study_uid and m.patient_id.strip() == ref.patient_id.strip()
                and (not ref.issuer or m.issuer == ref.issuer)
            ]  # fmt: skip
            if not found:
                raise DatasetError(
                    f"{where}: the PACS holds no such study for the manifest's patient_id "
                    "(a study of that UID held for another patient is not fetched)"
                )
            retrieve_once(client, found[0], folder)
        except PacsRequestError as exc:
            raise DatasetError(f"{where}: {str(exc)[:500]}") from None
        finally:
            client.close()
        return folder


def pacs_fetcher(settings: Any) -> PacsFetcher:
    """The fetcher the commands give the loader: the sandbox's study cache (DATA_DIR/cache)."""
    return PacsFetcher(settings, Path(settings.data_dir) / "cache")


def _norm(name: str) -> str:
    return name.strip().lower().replace(" ", "_").replace("-", "_")


MAX_VALUES_BYTES = 4 * 1024 * 1024


def _read_text(path: Path, what: str, limit: int) -> str:
    """A file the team gives, as text: bounded, UTF-8 (a BOM allowed), or CohortError."""
    try:
        if path.stat().st_size > limit:
            raise CohortError(f"{path}: over {limit} bytes; is it the right file?")
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise CohortError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CohortError(f"{path}: not UTF-8 text (save the {what} as UTF-8)") from None


def read_values(path: Path, column: str) -> list[str]:
    """The values of a query file (``--accession-file``, ``--patient-file``): one per line
    (``#`` starts a comment), or the ``column`` of a CSV with a header (``,``, ``;`` or tab
    separated, the column named in any case and with spaces or dashes: ``Accession Number``).
    A first line with a separator but no such column is refused: no value is guessed."""
    text = _read_text(path, f"{column} list", MAX_VALUES_BYTES)
    lines = text.splitlines()
    first = lines[0] if lines else ""
    delimiter = next((d for d in (",", ";", "\t") if d in first), None)
    names = [_norm(c) for c in first.split(delimiter)] if delimiter else [_norm(first)]
    if column in names:
        try:
            rows = list(csv.reader(lines[1:], delimiter=delimiter or ","))
        except csv.Error as exc:
            raise CohortError(f"{path}: not a CSV: {exc}") from None
        at = names.index(column)
        return [r[at].strip() for r in rows if len(r) > at and r[at].strip()]
    if delimiter:
        found = ", ".join(n[:40] for n in names[:20])
        raise CohortError(
            f"{path}: no {column} column (found: {found}); give a CSV with a {column} column, "
            "or one value per line"
        )
    return [v.strip() for v in lines if v.strip() and not v.lstrip().startswith("#")]


def _unprintable(value: str) -> bool:
    return any(not c.isprintable() for c in value)


def read_diagnoses(path: Path) -> tuple[list[DiagnosisRow], list[JoinIssue]]:
    """The rows of the team's diagnoses CSV, each checked; a bad row is an issue, not an end."""
    text = _read_text(path, "diagnoses CSV", MAX_CSV_BYTES)
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = reader.fieldnames or []
    except csv.Error as exc:
        raise CohortError(f"{path}: line 1: not a CSV header: {exc}") from None
    columns: dict[str, str] = {}
    for c in header:
        if _norm(c) in columns:
            raise CohortError(f"{path}: the column {_norm(c)[:40]!r} twice; keep one")
        columns[_norm(c)] = c
    for c in columns:  # a misspelt known column would drop its values silently
        near = difflib.get_close_matches(c, DIAGNOSIS_COLUMNS, n=1, cutoff=0.8)
        if c not in DIAGNOSIS_COLUMNS and near:
            raise CohortError(
                f"{path}: column {c[:40]!r}: did you mean {near[0]!r}? (columns: docs/cases.md, "
                "'A cohort from your PACS'; other columns are ignored)"
            )
    missing = [c for c in ("patient_id", "diagnosis") if c not in columns]
    if "study_uid" not in columns and "accession_number" not in columns:
        missing.append("study_uid or accession_number")
    if missing:
        raise CohortError(
            f"{path}: missing column(s) {', '.join(missing)} (columns: docs/cases.md, "
            f"'A cohort from your PACS'; found: {', '.join(list(columns)[:20]) or 'none'})"
        )
    from evaluation.datasets import ManifestCase

    rows: list[DiagnosisRow] = []
    issues: list[JoinIssue] = []
    n = 1
    while True:
        try:
            raw = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # a field over csv's limit, a broken quote...
            raise CohortError(f"{path}: line {reader.line_num + 1}: not a CSV row: {exc}") from None
        n = reader.line_num
        if len(rows) + len(issues) >= MAX_ROWS:
            raise CohortError(f"{path}: over {MAX_ROWS} rows")
        row = {k: (raw.get(v) or "").strip() for k, v in columns.items() if k in DIAGNOSIS_COLUMNS}
        if not any(row.values()):
            continue
        odd = next((k for k, v in row.items() if _unprintable(v) or len(v) > 500), None)
        if odd:
            issues.append(JoinIssue(kind="bad_row", line=n, detail=f"{odd}: over 500 characters "
                                    "or a control character"))  # fmt: skip
            continue
        uid, acc, pid = row.get("study_uid", ""), row.get("accession_number", ""), row["patient_id"]
        if not (uid or acc) or not pid or not row["diagnosis"]:
            issues.append(JoinIssue(kind="bad_row", line=n, study_uid=uid, accession=acc,
                                    detail="needs study_uid or accession_number, patient_id and "
                                    "diagnosis"))  # fmt: skip
            continue
        truth: dict[str, Any] = {"final_diagnosis": {"name": row["diagnosis"]}}
        if row.get("icd10"):
            truth["final_diagnosis"]["icd10"] = row["icd10"]
        if row.get("disease_group"):
            truth["final_diagnosis"]["group"] = row["disease_group"]
        for key, column in (("synonyms", "synonyms"), ("differential", "differential")):
            values = [v.strip() for v in row.get(column, "").split(";") if v.strip()][:20]
            if values:
                truth[key] = values if key == "synonyms" else [{"name": v} for v in values]
        try:  # the rule a manifest case's truth obeys, checked here, not after writing
            ManifestCase.model_validate({"study": ".", "ground_truth": truth})
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in first["loc"][1:])
            issues.append(JoinIssue(kind="bad_row", line=n, study_uid=uid, accession=acc,
                                    detail=f"{where}: {first['msg']}"[:300]))  # fmt: skip
            continue
        rows.append(DiagnosisRow(line=n, study_uid=uid, accession=acc, patient_id=pid, truth=truth))
    return rows, issues


def join_diagnoses(studies: list[CohortStudy], rows: Iterable[DiagnosisRow]) -> list[JoinIssue]:
    """Give each study the truth of its one row of the same patient; list everything else."""
    issues: list[JoinIssue] = []
    claimed: dict[int, list[DiagnosisRow]] = {}
    for row in rows:
        hits = [
            i for i, s in enumerate(studies)
            if (row.study_uid and s.match.study_uid == row.study_uid)
            or (not row.study_uid and row.accession and s.match.accession == row.accession)
        ]  # fmt: skip
        if not hits:
            issues.append(JoinIssue(kind="row_matches_no_study", line=row.line,
                                    study_uid=row.study_uid, accession=row.accession))  # fmt: skip
            continue
        mine = [i for i in hits if studies[i].match.patient_id.strip() == row.patient_id.strip()]
        if not mine:
            issues.append(JoinIssue(
                kind="patient_disagrees", line=row.line, study_uid=row.study_uid,
                accession=row.accession,
                detail="the archive holds this study for another patient; not joined",
            ))  # fmt: skip
            continue
        for i in mine:
            claimed.setdefault(i, []).append(row)
    for i, s in enumerate(studies):
        got = claimed.get(i, [])
        if len(got) == 1:
            s.truth = got[0].truth
        elif len(got) > 1:
            lines = ", ".join(str(r.line) for r in got[:10])
            issues.append(JoinIssue(kind="duplicate_rows", study_uid=s.match.study_uid,
                                    accession=s.match.accession,
                                    detail=f"lines {lines}; none joined"))  # fmt: skip
        else:
            issues.append(JoinIssue(kind="study_without_row", study_uid=s.match.study_uid,
                                    accession=s.match.accession, detail=s.case_id))  # fmt: skip
    return issues


def _comment(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:120]


def write_manifest(
    path: Path, cohort: Cohort, name: str | None, force: bool, by_uid: bool = False
) -> int:
    """Write the cases of the retrieved studies as a manifest; the number of cases written.
    ``by_uid``: each case names its study on the PACS (``{pacs, study_uid, patient_id}``,
    fetched on first use) rather than its folder in the cache."""
    from evaluation.datasets import ManifestCase

    if path.exists() and not force:
        raise CohortError(f"{path} exists: give --force to replace it, or another --out")
    parts = [
        f"# Written by `neurosandbox cases from-pacs --pacs {cohort.pacs}`: edit, then\n"
        f"# `neurosandbox cases check {path.name}`. Case and patient ids are pseudonyms; the\n"
        "# comments (accession, date, description) stay in this file and never enter a run.\n"
    ]
    if by_uid:
        parts.append(
            "# Each study is named on the PACS by its UID and the archive's PatientID (needed to\n"
            "# fetch it, never sent to a model): keep this file inside the hospital.\n"
        )
    if name:
        parts.append(yaml.safe_dump({"name": name}, allow_unicode=True, sort_keys=False))
    parts.append("cases:\n")
    n = 0
    for s in cohort.studies:
        if s.error or s.folder is None:
            continue
        m = s.match
        key = StudyKey(study_uid=m.study_uid, patient_id=m.patient_id, issuer=m.issuer)
        study: Any = str(s.folder.resolve())
        if by_uid and m.patient_id.strip():  # the archive's study with no PatientID: its folder
            study = {"pacs": cohort.pacs, "study_uid": m.study_uid, "patient_id": m.patient_id}
            if m.issuer:
                study["issuer"] = m.issuer
        case: dict[str, Any] = {
            "case_id": s.case_id,
            "patient_id": f"P-{key.patient_hash}",
            "study": study,
        }
        if s.truth:
            case["ground_truth"] = s.truth
        ManifestCase.model_validate(case)  # what is written is a valid case
        shown = ", ".join(x for x in (f"accession {m.accession}" if m.accession else "",
                                      str(m.study_date or ""), "/".join(m.modalities),
                                      json.dumps(m.description)[:80] if m.description else "")
                          if x)  # fmt: skip
        parts.append(f"# {_comment(shown)}\n")
        if not s.truth:
            parts.append(
                "# TODO: no diagnosis yet (ground_truth: {final_diagnosis: {name: ...}})\n"
            )
        block = yaml.safe_dump([case], allow_unicode=True, sort_keys=False)
        parts.append("".join(f"  {line}\n" for line in block.splitlines()))
        n += 1
    if n == 0:
        raise CohortError("no study was retrieved: no manifest written")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as fh:
        fh.write("".join(parts))
    return n

"""Fake but realistic patient identities (planted PHI) in several character sets.

Names come in the DICOM character set that can hold them (Latin-1, Greek, Cyrillic, UTF-8 for
Japanese, Chinese, Korean, Arabic, Polish, Czech, Turkish, plain ASCII with no
SpecificCharacterSet), so de-identification is tested on the encodings hospitals send.
Phone numbers are in ranges reserved for fiction (UK Ofcom 020 7946 0xxx, US 555-01xx); the
institutions and addresses are invented.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

# (DICOM SpecificCharacterSet, PN value, name as written in a note, sex)
_NAMES: tuple[tuple[str, str, str, str], ...] = (
    ("ISO_IR 100", "Müller^Jürgen", "Jürgen Müller", "M"),
    ("ISO_IR 100", "Lefèvre^Amélie", "Amélie Lefèvre", "F"),
    ("ISO_IR 100", "Núñez^José", "José Núñez", "M"),
    ("ISO_IR 100", "Østergård^Søren", "Søren Østergård", "M"),
    ("ISO_IR 100", "Björk^Åsa", "Åsa Björk", "F"),
    ("ISO_IR 100", "Gonçalves^Inês", "Inês Gonçalves", "F"),
    ("ISO_IR 100", "Weiß^Günther", "Günther Weiß", "M"),
    ("ISO_IR 126", "Παπαδόπουλος^Γιώργος", "Γιώργος Παπαδόπουλος", "M"),
    ("ISO_IR 126", "Οικονόμου^Ελένη", "Ελένη Οικονόμου", "F"),
    ("ISO_IR 144", "Иванов^Сергей", "Сергей Иванов", "M"),
    ("ISO_IR 144", "Смирнова^Ольга", "Ольга Смирнова", "F"),
    ("ISO_IR 192", "Yamada^Tarou=山田^太郎=やまだ^たろう", "山田 太郎 (Tarou Yamada)", "M"),
    ("ISO_IR 192", "Sato^Hanako=佐藤^花子=さとう^はなこ", "佐藤 花子 (Hanako Sato)", "F"),
    ("ISO_IR 192", "Wang^Xiaoming=王^小明", "王小明 (Xiaoming Wang)", "M"),
    ("ISO_IR 192", "Kim^Minjun=김^민준", "김민준 (Minjun Kim)", "M"),
    ("ISO_IR 192", "الرشيد^فاطمة", "فاطمة الرشيد", "F"),
    ("ISO_IR 192", "Wiśniewska^Zofia", "Zofia Wiśniewska", "F"),
    ("ISO_IR 192", "Dvořák^Tomáš", "Tomáš Dvořák", "M"),
    ("ISO_IR 192", "Yılmaz^Ayşe", "Ayşe Yılmaz", "F"),
    ("", "Smith^John", "John Smith", "M"),
    ("", "Taylor^Emma", "Emma Taylor", "F"),
)
_STREETS = (
    "Linden Row",
    "Harbour Lane",
    "Quarry Hill",
    "Mill Street",
    "Orchard Close",
    "Station Road",
)
_TOWNS = ("Westbury", "Lower Ashby", "Kingsmere", "Fenwick", "Oldcastle", "Marlow Vale")
_DOCTORS = ("Alvarez^Marta^^Dr", "Okafor^Chidi^^Dr", "Lindqvist^Henrik^^Dr", "Rao^Priya^^Dr")
INSTITUTION = "St. Elsewhere General Hospital"


@dataclass(frozen=True)
class Identity:
    charset: str  # DICOM SpecificCharacterSet ("" = default repertoire, element omitted)
    dicom_name: str  # PN value
    note_name: str  # how the name is written in notes
    family: str
    given: str
    sex: str  # "F" / "M"
    age: int
    birth_date: dt.date
    mrn: str
    other_id: str
    address: str
    phone: str
    referring: str
    accession: str
    institution: str = INSTITUTION


def make_identity(rng: np.random.Generator, age: int, sex: str, study_date: dt.date) -> Identity:
    """A fake patient of ``age`` and ``sex`` whose name matches the sex."""
    pool = [n for n in _NAMES if n[3] == sex]
    charset, pn, note, _ = pool[int(rng.integers(len(pool)))]
    alphabetic = pn.split("=")[0]
    family, given = ([*alphabetic.split("^"), ""])[:2]
    birth = study_date - dt.timedelta(days=int(age * 365.25 + rng.integers(1, 360)))
    mrn = f"PH{int(rng.integers(10**6, 10**7))}"
    other = f"NHS {int(rng.integers(100, 999))} {int(rng.integers(100, 999))} {int(rng.integers(1000, 9999))}"
    address = (
        f"{int(rng.integers(2, 120))} {_STREETS[int(rng.integers(len(_STREETS)))]}, "
        f"{_TOWNS[int(rng.integers(len(_TOWNS)))]}"
    )
    phone = f"+44 20 7946 0{int(rng.integers(0, 1000)):03d}"
    return Identity(
        charset=charset,
        dicom_name=pn,
        note_name=note,
        family=family,
        given=given,
        sex=sex,
        age=age,
        birth_date=birth,
        mrn=mrn,
        other_id=other,
        address=address,
        phone=phone,
        referring=_DOCTORS[int(rng.integers(len(_DOCTORS)))],
        accession=f"A{int(rng.integers(10**7, 10**8))}",
    )

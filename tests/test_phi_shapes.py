"""The PHI gate's rules as classes, each tested with members that neither planted set holds.

Planted set B (``test_phi_planted_b.py``) measured where the gate missed; the rules added for it
are general shapes (an IBAN with its check digits, digits in groups, an e-mail written with
[at]/[dot], a host name without its scheme, IP and MAC addresses, licence plates, telephone
numbers as other countries write them, letter-spaced capitals, hyphenated given
names, name particles, firms, ages over 89 in other languages or in words, dates with a Roman
month, a spelled day or no year, a year of birth, address labels in other languages, the town
before a postcode). Each class is checked here with other strings, written for this test, and
clinical text that looks like them must survive.
"""

from __future__ import annotations

import pytest

from evaluation.phi import scrub_text

LEAKS = [
    # (class, text, what must not arrive)
    ("iban", "Refund to GB82WEST12345698765432 please.", "GB82WEST"),
    ("iban", "Konto NL91ABNA0417164300.", "0417164300"),
    ("grouped digits", "AHV 756.1234.5678.97 on file.", "1234.5678"),
    ("grouped digits", "Insurance 123.4567.8901 (private).", "4567"),
    ("obfuscated e-mail", "Write to anna.berg (at) mail (dot) se today.", "anna.berg"),
    ("obfuscated e-mail", "p.rossi [at] posta [dot] it", "posta"),
    ("host without scheme", "Her blog: www.example.net/jane-travels", "jane-travels"),
    ("host without scheme", "See facebook.com/john.q.public for photos.", "john.q.public"),
    ("ipv6", "Pump uplink fe80::1ff:fe23:4567:890a reported.", "fe23"),
    ("ipv4", "Remote console 172.16.254.3 logged it.", "172.16"),
    ("mac", "Wearable 00-1A-2B-3C-4D-5E paired.", "3C-4D"),
    ("phone", "Call +41 44 668 18 00 after six.", "668 18 00"),
    ("phone", "Praxis 0221/478956, Sprechstunde", "478956"),
    ("phone", "Móvil +34 612 34 56 78.", "612 34"),
    ("plate", "Her car (B-XY 1234) was towed.", "XY 1234"),
    ("plate", "Véhicule AB-123-CD sur le parking.", "AB-123-CD"),
    ("serial", "Pacemaker serial PJN7734120X checked.", "PJN7734120X"),
    ("letter-spaced", "Referral for J O H N   S M I T H from the GP.", "Smith"),
    ("letter-spaced", "Visita: G I U L I A   R O S S I, nata a Roma", "Rossi"),
    ("hyphenated given name", "Hans-Jürgen Pfefferkorn rang twice.", "Pfefferkorn"),
    ("particles", "Reviewed by Dr. Pieter van den Broek.", "Broek"),
    ("particles", "Reviewed by Mr T. de Boer.", "Boer"),
    ("firm", "Works for Baker & Sons Ltd as a joiner.", "Baker"),
    ("firm", "Arbeitgeber: Huber Transporte GmbH, Schichtdienst.", "Huber"),
    ("age in another language", "Mutter 92 Jahre alt, gesund.", "92 Jahre"),
    ("age in another language", "Son père, 95 ans, vit seul.", "95 ans"),
    ("age in words", "Her father, aged ninety-one, lives nearby.", "ninety-one"),
    ("age in words", "a hundred and two years old grandmother", "hundred and two"),
    ("roman month", "Visita del 12.VI.1999.", "12.VI.1999"),
    ("spelled day", "Appointment on the twenty-second of June.", "twenty-second of June"),
    ("spelled day", "Review June the ninth, 2025.", "June the ninth"),
    ("day without year", "Letzte Kontrolle am 05.06. unauffällig.", "05.06."),
    ("month with 'de'", "Operada en enero de 2020.", "enero de 2020"),
    ("year of birth", "Her grandmother (born in 1928) has dementia.", "1928"),
    ("year of birth", "Vater, geb. 1930, Demenz.", "1930"),
    ("address label", "Wohnort: Kleinkleckersdorf", "Kleinkleckersdorf"),
    ("address label", "Domicilio: Pueblonuevo del Mar", "Pueblonuevo"),
    ("town before postcode", "Practice address Leeds LS1 4DY.", "Leeds"),
]
KEEP = [
    "INR 1.1.",
    "BP 168/94 mmHg",
    "CHA2DS2-VASc 3",
    "T2-FLAIR",
    "GCS 14 (E4 V4 M6)",
    "M2 segment",
    "aged 78",
    "Guillain-Barré syndrome",
    "Virchow-Robin spaces",
    "HbA1c 6.5%",
    "ICD-10 I63.5",
    "at 10:45",
    "K+ 3.5-5.0 mmol/L",
    "MRI 1.5 T",
    "SARS-CoV-2",
    "AQP4-IgG negative",
    "B12 400 ng/L",
    "EDSS 2.5.",
    "for 3 days",
    "90 mg aspirin",
    "ninety minutes",
    "sensitivity 0.92, 95% CI 0.88-0.95",
    "a hundred metres",
    "Version 2.4.1 of the protocol",
]


@pytest.mark.parametrize(("kind", "text", "secret"), LEAKS, ids=[f"{k}:{s}" for k, s, _ in LEAKS])
def test_each_class_of_identifier_is_scrubbed(kind: str, text: str, secret: str) -> None:
    out, counts = scrub_text(text, [])
    # (letters and digits alone too: a letter-spaced or re-spaced secret is still the secret)
    squeeze = "".join(c for c in out.casefold() if c.isalnum())
    assert secret.casefold() not in out.casefold(), (kind, out)
    assert "".join(c for c in secret.casefold() if c.isalnum()) not in squeeze, (kind, out)
    assert counts, kind


def test_clinical_text_that_looks_like_them_survives() -> None:
    text = "\n".join(KEEP)
    out, counts = scrub_text(text, [])
    lost = [k for k in KEEP if k not in out]
    assert not lost, (lost, counts)

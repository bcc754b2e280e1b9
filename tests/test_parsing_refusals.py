"""Refusals are recognised by their structure after Unicode normalisation (issue 18)."""

from __future__ import annotations

import pytest

from evaluation.case import TaskFamily
from evaluation.parsing import parse_answer
from evaluation.scores import ParseStatus

REFUSALS = [
    "I can’t provide a diagnosis from these images.",
    "I won't provide a diagnosis.",
    "As an AI language model, I cannot give medical advice.",
    "I’m not able to interpret medical images. Please consult a radiologist.",
    "Sorry — I am unable to offer a medical opinion on this scan.",
    "I will not diagnose patients; please see a qualified clinician.",
    "I must respectfully decline to interpret this study.",
    "I do not feel comfortable providing a diagnosis.",
    "I'm sorry, but I can't help with diagnosing this MRI.",
]
NOT_REFUSALS = [
    "The lesion can't be a meningioma; it is probably a glioma. No JSON, sorry.",
    "Findings: left frontal mass. Diagnosis: glioblastoma.",
]


@pytest.mark.parametrize("text", REFUSALS)
def test_refusals_are_refusals(text: str) -> None:
    assert parse_answer(text, TaskFamily.DIFFERENTIAL).status is ParseStatus.REFUSAL


@pytest.mark.parametrize("text", NOT_REFUSALS)
def test_prose_answers_are_format_failures(text: str) -> None:
    assert parse_answer(text, TaskFamily.DIFFERENTIAL).status is ParseStatus.FORMAT_FAILURE

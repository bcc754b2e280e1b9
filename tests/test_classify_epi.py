"""EPI series without a telling name: classified from their headers, with the reason stated.

An EPI readout (ScanningSequence EP, or an EPI sequence name such as Siemens' ``epfid2d``)
repeated at the same slice positions is a time series: with a contrast agent it is a DSC
perfusion run, without one a functional run. A single gradient-echo EPI volume is T2*-weighted.
The series here are real DICOM files written with pydicom and read by the index.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

from dicom.index import index_path
from dicom.records import SequenceClass, SeriesInfo

C = SequenceClass


def _epi_series(
    folder: Path,
    *,
    volumes: int,
    slices: int = 4,
    scanning_sequence: list[str] | str = ("GR", "EP"),  # type: ignore[assignment]
    sequence_name: str = "*epfid2d1_64",
    echo_time: float = 30.0,
    agent: str | None = None,
    description: str = "series 5",
    protocol: str | None = None,
    repetition_time: float = 1500.0,
) -> Path:
    """One EPI series of ``volumes`` time points x ``slices`` axial slices, one file per image."""
    folder.mkdir(parents=True, exist_ok=True)
    study, series = generate_uid(), generate_uid()
    n = 0
    for t in range(volumes):
        for k in range(slices):
            n += 1
            sop = generate_uid()
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = MRImageStorage
            meta.MediaStorageSOPInstanceUID = sop
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            path = folder / f"im{n:04d}.dcm"
            ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
            ds.SOPClassUID = MRImageStorage
            ds.SOPInstanceUID = sop
            ds.StudyInstanceUID = study
            ds.SeriesInstanceUID = series
            ds.Modality = "MR"
            ds.Manufacturer = "SYNTH"
            ds.SeriesNumber = 5
            ds.InstanceNumber = n
            ds.AcquisitionNumber = t + 1
            ds.TemporalPositionIdentifier = t + 1
            ds.SeriesDescription = description
            ds.ProtocolName = description if protocol is None else protocol
            ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "NONE"]
            if scanning_sequence:
                ds.ScanningSequence = list(scanning_sequence)
            ds.SequenceVariant = ["SK"]
            if sequence_name:
                ds.SequenceName = sequence_name
            ds.MRAcquisitionType = "2D"
            ds.RepetitionTime = repetition_time
            ds.EchoTime = echo_time
            ds.FlipAngle = 90
            if agent is not None:
                ds.ContrastBolusAgent = agent
            ds.SliceThickness = 5.0
            ds.PixelSpacing = [3.0, 3.0]
            ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
            ds.ImagePositionPatient = [-30.0, -30.0, -10.0 + 5.0 * k]
            ds.Rows = ds.Columns = 16
            ds.SamplesPerPixel = 1
            ds.PhotometricInterpretation = "MONOCHROME2"
            ds.BitsAllocated = ds.BitsStored = 16
            ds.HighBit = 15
            ds.PixelRepresentation = 0
            ds.PixelData = np.full((16, 16), 100 + t, dtype=np.uint16).tobytes()
            ds.save_as(path, enforce_file_format=True)
    return folder


def _only(folder: Path) -> SeriesInfo:
    result = index_path(folder)
    assert result.errors == [], result.errors
    assert len(result.series) == 1, [s.stack_label for s in result.series]
    return result.series[0]


def test_epi_time_series_with_a_contrast_agent_is_dsc_perfusion(tmp_path: Path) -> None:
    s = _only(_epi_series(tmp_path / "dsc", volumes=12, agent="Gadovist"))
    assert s.shape == [16, 16, 4, 12]
    assert s.series_class is C.PERFUSION, s.reason
    assert "DSC" in s.detail
    assert "ContrastBolusAgent 'Gadovist'" in s.reason
    assert "12 volumes at the same slice positions" in s.reason
    assert "ScanningSequence GR/EP" in s.reason


def test_epi_time_series_without_contrast_is_functional(tmp_path: Path) -> None:
    s = _only(_epi_series(tmp_path / "bold", volumes=12))
    assert s.series_class is C.FMRI, s.reason
    assert "12 volumes at the same slice positions" in s.reason
    assert "no contrast agent" in s.reason


def test_epi_named_only_by_its_sequence_name_is_still_epi(tmp_path: Path) -> None:
    """Some scanners write ScanningSequence GR for a gradient-echo EPI; the name says EPI."""
    folder = _epi_series(tmp_path / "gr", volumes=6, scanning_sequence=["GR"])
    s = _only(folder)
    assert s.series_class is C.FMRI, s.reason
    assert "SequenceName '*epfid2d1_64'" in s.reason
    agent = _only(
        _epi_series(tmp_path / "gr_gd", volumes=6, scanning_sequence=["GR"], agent="Gd-DOTA")
    )
    assert agent.series_class is C.PERFUSION, agent.reason


def test_single_gradient_echo_epi_volume_is_t2star(tmp_path: Path) -> None:
    s = _only(_epi_series(tmp_path / "one", volumes=1, slices=6))
    assert s.shape == [16, 16, 6]
    assert s.series_class is C.T2STAR, s.reason
    assert s.confidence > 0
    assert "single" in s.reason and "gradient-echo EPI" in s.reason
    assert "EchoTime 30 ms" in s.reason


def test_gradient_echo_is_read_from_the_siemens_sequence_name(tmp_path: Path) -> None:
    """'epfid' is Siemens' gradient-echo (FID) EPI; ScanningSequence may say only EP."""
    s = _only(_epi_series(tmp_path / "ep", volumes=1, scanning_sequence=["EP"]))
    assert s.series_class is C.T2STAR, s.reason
    assert "SequenceName '*epfid2d1_64'" in s.reason


def test_single_spin_echo_epi_volume_stays_unknown_with_a_reason(tmp_path: Path) -> None:
    s = _only(
        _epi_series(
            tmp_path / "se",
            volumes=1,
            scanning_sequence=["SE", "EP"],
            sequence_name="*epse2d1_64",
            echo_time=80.0,
        )
    )
    assert s.series_class is C.UNKNOWN
    assert "spin-echo EPI" in s.reason and "one volume" in s.reason


def test_a_telling_description_still_wins(tmp_path: Path) -> None:
    s = _only(_epi_series(tmp_path / "bold", volumes=1, description="rest_bold"))
    assert s.series_class is C.FMRI, s.reason
    dsc = _only(_epi_series(tmp_path / "dsc", volumes=3, description="ep2d_perf DSC"))
    assert dsc.series_class is C.PERFUSION, dsc.reason


def test_nifti_epi_time_series_counts_its_volumes(tmp_path: Path) -> None:
    """A 4D NIfTI is classified with its number of volumes, as a DICOM series is."""
    data = np.zeros((8, 8, 4, 5), dtype=np.int16)
    path = tmp_path / "run.nii"
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
    sidecar = {
        "Modality": "MR",
        "SeriesDescription": "series 5",
        "ScanningSequence": "GR\\EP",
        "SequenceName": "epfid2d1_64",
        "EchoTime": 0.03,
        "RepetitionTime": 1.5,
    }
    (tmp_path / "run.json").write_text(json.dumps(sidecar))
    s = index_path(path).series[0]
    assert s.shape == [8, 8, 4, 5]
    assert s.series_class is C.FMRI, s.reason
    assert "5 volumes" in s.reason


@pytest.mark.corpus
def test_corpus_epi_series_keep_their_labels(corpus: Path, corpus_index) -> None:  # type: ignore[no-untyped-def]
    """The real EPI series (Siemens BOLD, ASL, perfusion-weighted, a mosaic run, SMS) keep their
    classes: descriptions and ImageType still decide before the EPI readout does."""
    by_folder = {
        "siemens_xa30/In/7001_func-bold_task-fa_run-1": C.FMRI,
        "siemens_xa30/In/18001_asl_2d_tra": C.PERFUSION,
        "siemens_xa30/In/19001_asl_2d_tra": C.PERFUSION,
        "transfer_syntaxes/In": C.FMRI,
        "enhanced_mr/In/Siemens/XA10": C.FMRI,
    }
    for folder, cls in by_folder.items():
        root = corpus / folder
        stacks = [s for s in corpus_index.series if Path(s.path) == root]
        assert stacks, folder
        assert {s.series_class for s in stacks} == {cls}, [s.reason for s in stacks]


# --- EPI named in the description or protocol, with the vendors' separators ------------------


def test_philips_t2w_fe_epi_single_volume_is_t2star(tmp_path: Path) -> None:
    """Philips writes ScanningSequence GR and no SequenceName; 'FE-EPI' is the readout and the
    'T2W' beside it is the T2*-weighting of a gradient-echo EPI, not a contradiction."""
    s = _only(
        _epi_series(
            tmp_path / "philips",
            volumes=1,
            slices=6,
            scanning_sequence=["GR"],
            sequence_name="",
            echo_time=35.0,
            description="T2W/FE-EPI",
            protocol="T2W/FE-EPI SENSE",
        )
    )
    assert s.series_class is C.T2STAR, s.reason
    assert "FE-EPI" in s.reason and "gradient" in s.reason


def test_philips_t2w_fe_epi_time_series_is_functional_or_perfusion(tmp_path: Path) -> None:
    kw = dict(
        scanning_sequence=["GR"],
        sequence_name="",
        echo_time=35.0,
        description="T2W/FE-EPI",
        protocol="T2W/FE-EPI SENSE",
    )
    bold = _only(_epi_series(tmp_path / "bold", volumes=8, **kw))  # type: ignore[arg-type]
    assert bold.series_class is C.FMRI, bold.reason
    dsc = _only(_epi_series(tmp_path / "dsc", volumes=8, agent="Gadovist", **kw))  # type: ignore[arg-type]
    assert dsc.series_class is C.PERFUSION, dsc.reason


@pytest.mark.parametrize(
    "name",
    [
        "FE-EPI",
        "FE_EPI",
        "fe epi",
        "FEEPI",
        "FFE-EPI",
        "EPI2D",
        "ep2d_fid",
        "ep2d_bold_mb",
        "epi_gre_2mm",
        "EPI/T2*",
        "GRE-EPI",
        "GE-EPI",
        "ep2d_pace",
        "EPI",
    ],
)
def test_vendor_spellings_of_an_epi_readout_are_epi(tmp_path: Path, name: str) -> None:
    """Named in the description only (ScanningSequence GR, no SequenceName): a time series of
    such a readout is a functional run, not a structural T2* (old code: T2STAR or UNKNOWN)."""
    s = _only(
        _epi_series(
            tmp_path / "x",
            volumes=5,
            scanning_sequence=["GR"],
            sequence_name="",
            description=name,
        )
    )
    assert s.series_class is C.FMRI, (name, s.reason)
    assert "EPI" in s.reason


@pytest.mark.parametrize("name", ["SE-EPI", "SE_EPI", "SEEPI"])
def test_spin_echo_epi_spellings_give_the_echo_when_no_tag_does(tmp_path: Path, name: str) -> None:
    s = _only(
        _epi_series(
            tmp_path / "se",
            volumes=1,
            scanning_sequence=[],
            sequence_name="",
            echo_time=80.0,
            description=name,
        )
    )
    assert s.series_class is C.UNKNOWN
    assert "spin-echo EPI" in s.reason, s.reason


def test_fe_epi_spelling_gives_gradient_echo_when_no_tag_does(tmp_path: Path) -> None:
    s = _only(
        _epi_series(
            tmp_path / "fe",
            volumes=1,
            scanning_sequence=[],
            sequence_name="",
            echo_time=30.0,
            description="T2*W_FE_EPI",
        )
    )
    assert s.series_class is C.T2STAR, s.reason


@pytest.mark.parametrize(
    "name", ["Epilepsy 3D T1", "epilepsy_T1_mprage", "T1 deep grey", "sep T1", "step T1 pre"]
)
def test_words_that_contain_ep_are_not_epi(tmp_path: Path, name: str) -> None:
    """'epilepsy' starts with 'epi': a whole-word reading, not a substring one."""
    s = _only(
        _epi_series(
            tmp_path / "t1",
            volumes=1,
            scanning_sequence=["GR"],
            sequence_name="",
            echo_time=3.0,
            repetition_time=8.0,
            description=name,
        )
    )
    assert s.series_class is C.T1, (name, s.reason)
    assert "EPI" not in s.reason

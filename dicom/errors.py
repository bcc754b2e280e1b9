"""Specific error types of the imaging core, with messages a user can act on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dicom.records import SeriesInfo


class ImagingError(Exception):
    """Base class for imaging-core errors."""


class NotDicomError(ImagingError):
    """The file is not a DICOM Part 10 file (nor a raw dataset we can recognise)."""


class UnreadableHeaderError(ImagingError):
    """The header could not be parsed (truncated, corrupt, pathologically nested)."""


class NonImageError(ImagingError):
    """The object carries no image (SR, Raw Data, presentation state, ...)."""


class TooLargeError(ImagingError):
    """Decoding the pixels would need more memory than the configured cap."""


class InvalidImageError(ImagingError):
    """Image attributes are missing or inconsistent (no Rows, zero Columns, ...)."""


class MeaninglessPixelsError(InvalidImageError):
    """Header values make the stored pixels meaningless (a rescale that is not a finite number
    or leaves float32, BitsStored or HighBit that do not fit BitsAllocated, pixel data of
    another size than the header describes, ...): the file is refused, the series goes on."""


class DecodeError(ImagingError):
    """Pixel data could not be decoded."""


class SeriesSelectionError(ImagingError):
    """A series selector (UID, number, short form) did not name exactly one series.

    ``candidates`` holds one stack per series a user may choose from instead.
    """

    def __init__(self, message: str, selector: str, candidates: Sequence[SeriesInfo]) -> None:
        super().__init__(message)
        self.selector = selector
        self.candidates = list(candidates)

    def __reduce__(self) -> tuple[object, ...]:  # pickled back from a worker process whole
        return (type(self), (str(self), self.selector, self.candidates))


class SeriesNotFoundError(SeriesSelectionError):
    """No series matched the requested UID or number; ``candidates`` are every series there is."""


class AmbiguousSeriesError(SeriesSelectionError):
    """The requested number (or short UID) matched several series; ``candidates`` are those."""


class MixedPatientsError(ImagingError):
    """One study or series names more than one patient: it is never evaluated as one."""

    def __init__(self, message: str, identities: Sequence[str]) -> None:
        super().__init__(message)
        self.identities = list(identities)

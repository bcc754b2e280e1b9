"""Specific error types of the imaging core, with messages a user can act on."""


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


class DecodeError(ImagingError):
    """Pixel data could not be decoded."""


class SeriesNotFoundError(ImagingError):
    """No series matched the requested UID."""

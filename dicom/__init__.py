"""dicom."""

# The public face: the one list of its names, each imported on first use (lazy_loader);
# type checkers read this stub. Nothing outside the package imports past it.
from .atomic import atomic_write as atomic_write
from .classify import classify as classify
from .credentials import PACS_CREDENTIAL_ENV as PACS_CREDENTIAL_ENV
from .credentials import CredentialNameError as CredentialNameError
from .credentials import credential as credential
from .credentials import pacs_credential as pacs_credential
from .defaults import DEFAULT_MEMORY_CAP as DEFAULT_MEMORY_CAP
from .defaults import configure_header_cache as configure_header_cache
from .deid import Deidentifier as Deidentifier
from .deid import DeidPolicy as DeidPolicy
from .deid_study import DeidentifiedStudy as DeidentifiedStudy
from .deid_study import DeidSummary as DeidSummary
from .deid_study import ExportedSeries as ExportedSeries
from .deid_study import SkippedSeries as SkippedSeries
from .deid_study import SourceIdentifiers as SourceIdentifiers
from .deid_study import StudyCheck as StudyCheck
from .deid_study import deidentify_study as deidentify_study
from .deid_study import verify_deidentified_study as verify_deidentified_study
from .display import side_marks as side_marks
from .errors import AmbiguousSeriesError as AmbiguousSeriesError
from .errors import ImagingError as ImagingError
from .errors import MeaninglessPixelsError as MeaninglessPixelsError
from .errors import MixedPatientsError as MixedPatientsError
from .errors import SeriesNotFoundError as SeriesNotFoundError
from .errors import SeriesSelectionError as SeriesSelectionError
from .geometry import slice_centre as slice_centre
from .headers.batch import read_headers as read_headers
from .identity import HeaderIdentity as HeaderIdentity
from .identity import checked_attributes as checked_attributes
from .identity import distinct_patients as distinct_patients
from .identity import header_value_problem as header_value_problem
from .identity import one_patient as one_patient
from .identity import patients_in as patients_in
from .identity import study_identity as study_identity
from .identity import study_identity_and_persons as study_identity_and_persons
from .index import index_path as index_path
from .person import (
    NamedPerson as NamedPerson,
)
from .person import (
    PersonName as PersonName,
)
from .person import (
    PersonNameError as PersonNameError,
)
from .person import (
    display_name as display_name,
)
from .person import (
    parse_person_name as parse_person_name,
)
from .person import (
    person_name as person_name,
)
from .person import (
    person_names as person_names,
)
from .pixels import load_volume as load_volume
from .records import (
    CLINICAL_CLASSES as CLINICAL_CLASSES,
)
from .records import (
    FileError as FileError,
)
from .records import (
    IndexResult as IndexResult,
)
from .records import (
    PatientKey as PatientKey,
)
from .records import (
    RenderedImage as RenderedImage,
)
from .records import (
    SequenceClass as SequenceClass,
)
from .records import (
    SeriesInfo as SeriesInfo,
)
from .records import (
    TilePlace as TilePlace,
)
from .render import (
    RenderOptions as RenderOptions,
)
from .render import (
    default_targets as default_targets,
)
from .render import (
    render_path as render_path,
)
from .render import (
    renderer_version as renderer_version,
)
from .selection import ELLIPSIS as ELLIPSIS
from .selection import NotShownReason as NotShownReason
from .selection import SeriesNotShown as SeriesNotShown
from .selection import UnshownSeries as UnshownSeries
from .selection import series_candidates as series_candidates
from .selection import unshown as unshown
from .sources import FileTooLargeError as FileTooLargeError
from .sources import NotRegularFileError as NotRegularFileError
from .sources import check_regular as check_regular
from .sources import read_regular as read_regular
from .uids import InvalidUIDError as InvalidUIDError
from .uids import check_uid as check_uid
from .uids import valid_uid as valid_uid
from .warmup import warm_up as warm_up

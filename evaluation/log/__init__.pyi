# The run log's public face: the one list of its names, each imported on first use (lazy_loader).
from .records import CallErrors as CallErrors
from .records import RunRow as RunRow
from .records import SampleRow as SampleRow
from .records import StoreCounts as StoreCounts
from .rundata import FULL_INPUT as FULL_INPUT
from .rundata import RunData as RunData
from .rundata import SampleResult as SampleResult
from .store import STORE_FILE as STORE_FILE
from .store import RunStore as RunStore
from .writes import sample_id as sample_id

# The budget's public face (lazy_loader); the runner uses the gate's module directly.
from .estimate import DEFAULT_GRADER_OUTPUT_TOKENS as DEFAULT_GRADER_OUTPUT_TOKENS
from .estimate import DEFAULT_LATENCY_S as DEFAULT_LATENCY_S
from .estimate import DEFAULT_OUTPUT_TOKENS as DEFAULT_OUTPUT_TOKENS
from .estimate import ModelEstimate as ModelEstimate
from .estimate import ModelHistory as ModelHistory
from .estimate import RunEstimate as RunEstimate
from .estimate import estimate_run as estimate_run
from .estimate import history_of_runs as history_of_runs
from .gate import BudgetReached as BudgetReached
from .gate import UnknownPriceError as UnknownPriceError
from .gate import check_prices as check_prices

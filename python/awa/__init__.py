"""Awa: a Postgres-native background job queue with a Rust core.

The public API is this package's ``__all__``; the native module ``awa._awa`` is private.
"""

from __future__ import annotations

import atexit as _atexit
from importlib.metadata import version as _distribution_version

from . import _awa, callback_contract
from ._awa import (
    AwaError,
    CallbackNotFound,
    ConfigError,
    DatabaseError,
    ForeignSchema,
    JobNotFound,
    SchemaNotMigrated,
    SerializationError,
    StagingError,
    TerminalError,
    UniqueConflict,
    UnknownJobKind,
    ValidationError,
)
from ._batch_ops import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)
from ._client import AsyncClient, Client, SyncTransaction, Transaction
from ._convert import MAX_JSON_DEPTH, derive_kind
from ._job import Job
from ._migrations import current_migration_version, migrate, migrations, migrations_range, schema_patches
from ._metrics import init_telemetry, serve_metrics, shutdown_telemetry
from ._partitioned import PartitionedQueue
from ._outcomes import CallbackToken, Cancel, RetryAfter, Snooze, WaitForCallback
from ._results import DlqEntry, HealthCheck, QueueHealth, QueueStat, ResolveResult, RetryFailedResult
from ._states import DEFAULT_UNIQUE_STATES, JobState, unique_states

__version__ = _distribution_version("awa-queue")  # the installed distribution's, i.e. pyproject.toml's

# Registered first, so it runs last (atexit is LIFO): after every client has closed its pool,
# give runtime threads a moment to leave Python before the interpreter finalizes.
_atexit.register(lambda: _awa.quiesce(50))

__all__ = [
    "AsyncClient",
    "AwaError",
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationPreview",
    "BatchOperationState",
    "CallbackToken",
    "Cancel",
    "CallbackNotFound",
    "Client",
    "ConfigError",
    "DEFAULT_UNIQUE_STATES",
    "DatabaseError",
    "DlqEntry",
    "HealthCheck",
    "ForeignSchema",
    "Job",
    "JobNotFound",
    "JobState",
    "MAX_JSON_DEPTH",
    "PartitionedQueue",
    "QueueHealth",
    "QueueStat",
    "ResolveResult",
    "RetryAfter",
    "RetryFailedResult",
    "SchemaNotMigrated",
    "SerializationError",
    "Snooze",
    "StagingError",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UnknownJobKind",
    "ValidationError",
    "WaitForCallback",
    "__version__",
    "callback_contract",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "migrate",
    "migrations",
    "migrations_range",
    "schema_patches",
    "serve_metrics",
    "shutdown_telemetry",
    "unique_states",
]

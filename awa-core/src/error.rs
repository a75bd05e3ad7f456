//! The engine's error type. Every fallible public function returns [`AwaError`]; the Python
//! bindings map each variant to one exception class.

use crate::follow_ups::StageError;
use crate::model::ValidationError;

/// Anything the engine can report to a caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AwaError {
    /// An insert request broke a rule (priority, lengths, tags, NUL bytes, run_at, ...).
    #[error("invalid job: {0}")]
    Validation(#[from] ValidationError),
    /// Args, metadata or a payload could not be converted to or from JSON.
    #[error("serialization failed: {0}")]
    Serialization(String),
    /// A unique job with the same key already exists in one of its unique states.
    #[error("a job of kind {kind:?} with the same unique key already exists")]
    UniqueConflict { kind: String },
    /// Awa's own schema (or one of its tables, functions or types) is missing: run
    /// `migrate()`. `detail` is PostgreSQL's message naming the missing object. Raised only
    /// when the missing object is in schema `awa`; a missing object of the caller's own is a
    /// [`AwaError::Database`] error.
    #[error("the awa schema is not migrated ({detail}); call migrate() first")]
    SchemaNotMigrated { detail: String },
    /// The database's `awa` schema was created by another implementation (awa-pg), so this
    /// library neither migrates nor uses it (`storage::foreign`). The message says what was
    /// found and what to do. Python raises it as `awa.ForeignSchema`, a subclass of
    /// `awa.SchemaNotMigrated`.
    #[error(
        "the database's awa schema was created by {created_by} (its schema version {}), not by \
         this library (schema version {ours}); Awa never migrates or uses another \
         implementation's schema. Point this client at another database, or, if {created_by} no \
         longer uses this one, move its schema aside first (ALTER SCHEMA awa RENAME TO \
         awa_pg_old) and run migrate(). See docs/unique-keys.md, \"Foreign schema\"",
        version.map_or_else(|| "unknown".to_string(), |v| v.to_string())
    )]
    ForeignSchema {
        created_by: String,
        version: Option<i32>,
        ours: i32,
    },
    /// No handler is registered for the job's kind.
    #[error("no handler registered for job kind {0:?}")]
    UnknownJobKind(String),
    /// No job has this id.
    #[error("job {0} not found")]
    JobNotFound(i64),
    /// No waiting job has this callback id (unknown, already resolved, or timed out).
    #[error("callback {0} not found or already resolved")]
    CallbackNotFound(String),
    /// A durable batch operation call was refused (docs/batch-operations.md): an unknown
    /// `op_kind`, a bad spec or filter, an empty filter without `allow_all`, a malformed or
    /// unknown operation id, or a cancel of an operation that is no longer active. Python
    /// raises `awa.ValidationError`, the class awa-pg raises for all of these.
    #[error("{0}")]
    BatchOperation(String),
    /// A follow-up could not be staged.
    #[error(transparent)]
    Staging(#[from] StageError),
    /// A configuration value was out of range. The message names the setting and its range
    /// (`poll_interval_ms is NaN; it must be a number between 1 and ...`).
    #[error("{0}")]
    Config(String),
    /// The client was used after shutdown, or before start where start is required.
    #[error("{0}")]
    State(String),
    /// A connection could not be opened: the address (`host:port`) and the cause
    /// ("connection refused", "no such host", "timed out after 5 s", the server's
    /// authentication error with its SQLSTATE, "certificate verify failed ..."). Never the
    /// URL, which may hold a password.
    #[error(transparent)]
    Connect(ConnectFailure),
    /// The database URL is malformed (scheme, port, an unknown `sslmode`, a `connect_timeout`
    /// that is not a number, ...). The message names the part, never the URL.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// A storage-transition step or a queue-storage install was refused in the state the
    /// database is in (docs/storage-transition.md): the message is awa-pg's
    /// ("storage finalize is only allowed from mixed_transition state", "cannot finalize while
    /// canonical live backlog is 3", "cannot install queue storage while the worker runtime is
    /// running"). Python raises `awa.AwaError`, as awa-pg does.
    #[error("{0}")]
    Storage(String),
    /// A queue-storage setting was invalid (`invalid SQL identifier: Bad-Name`, `queue storage
    /// requires at least 4 queue slots`, an unknown engine). Python raises
    /// `awa.ValidationError`, as awa-pg does.
    #[error("{0}")]
    InvalidStorage(String),
    /// A write reached an engine that no longer takes new jobs (SQLSTATE `AWR01`: canonical
    /// after a finalize, a queue-storage schema after an abort). Routed inserts read the route
    /// again and retry once; a caller's own transaction sees this error and may retry whole.
    #[error("{0}")]
    StorageRouteMoved(String),
    /// Any other database error. The message carries the server's text and, for an error the
    /// server reported, its SQLSTATE as `database error (SQLSTATE 42601): ...`.
    #[error("{}", database_message(.0))]
    Database(sqlx::Error),
}

impl From<serde_json::Error> for AwaError {
    fn from(e: serde_json::Error) -> Self {
        // serde_json stops parsing at 128 levels; anything that deep is past MAX_JSON_DEPTH
        // too, and is a request that broke the documented limit, not a malformed document.
        if e.to_string().starts_with("recursion limit exceeded") {
            return AwaError::Validation(ValidationError::TooDeep {
                path: "a JSON value".into(),
                limit: crate::model::MAX_JSON_DEPTH,
            });
        }
        AwaError::Serialization(e.to_string())
    }
}

/// A connection attempt that failed: where to, and why, in the words libpq users know. Travels
/// inside sqlx's I/O error (so retry logic sees a lost connection) until it becomes
/// [`AwaError::Connect`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("could not connect to the database at {address}: {cause}")]
pub struct ConnectFailure {
    pub address: String,
    pub cause: String,
}

impl From<sqlx::Error> for AwaError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Io(io) = &e {
            if let Some(failure) = io
                .get_ref()
                .and_then(|i| i.downcast_ref::<ConnectFailure>())
            {
                return AwaError::Connect(failure.clone());
            }
        }
        if let Some(db) = e.as_database_error() {
            let missing_object = matches!(
                db.code().as_deref(),
                // undefined_table / invalid_schema_name / undefined_function / undefined_object
                Some("42P01") | Some("3F000") | Some("42883") | Some("42704")
            );
            if missing_object && names_awa_object(db.message()) {
                return AwaError::SchemaNotMigrated {
                    detail: db.message().to_string(),
                };
            }
            // Raised by migration 12's storage functions and route guards.
            match db.code().as_deref() {
                Some("AWR01") => return AwaError::StorageRouteMoved(db.message().to_string()),
                Some("55000") if is_storage_message(db.message()) => {
                    return AwaError::Storage(db.message().to_string())
                }
                Some("22023") if is_storage_message(db.message()) => {
                    return AwaError::InvalidStorage(db.message().to_string())
                }
                _ => {}
            }
        }
        AwaError::Database(e)
    }
}

/// Whether a message is one of the storage-transition functions' own (migration 12), so a
/// user's statement failing with the same generic SQLSTATE stays a database error.
fn is_storage_message(message: &str) -> bool {
    message.starts_with("storage ")
        || message.starts_with("cannot enter mixed transition")
        || message.starts_with("cannot finalize")
        || message.starts_with("cannot abort mixed transition")
        || message.starts_with("queue storage schema")
        || message.starts_with("unknown storage engine")
}

/// Whether PostgreSQL's "does not exist" message names an object of Awa's own schema:
/// `relation "awa.jobs"`, `schema "awa"`, `function awa.insert_follow_up(...)`,
/// `type "awa.job_state"`. A user's own missing table (a typo in `Transaction.execute`) does
/// not match, so it reads as the database error it is instead of "call migrate()".
fn names_awa_object(message: &str) -> bool {
    message.contains("\"awa.") || message.contains("\"awa\"") || message.contains(" awa.")
}

/// `database error (SQLSTATE xxxxx): <server message>` for an error the server reported, else
/// `database error: <cause>` (I/O, pool timeout, protocol).
fn database_message(e: &sqlx::Error) -> String {
    match e.as_database_error() {
        Some(db) => match db.code() {
            Some(code) => format!("database error (SQLSTATE {code}): {}", db.message()),
            None => format!("database error: {}", db.message()),
        },
        None => format!("database error: {e}"),
    }
}

impl AwaError {
    /// The SQLSTATE of a database error the server reported, if any.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            AwaError::Database(e) => e
                .as_database_error()
                .and_then(|db| db.code())
                .map(|c| c.into_owned()),
            _ => None,
        }
    }
}

/// Whether a database error is the deduplication index rejecting a row.
pub(crate) fn is_unique_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|db| {
        db.code().as_deref() == Some("23505") && db.constraint() == Some("idx_awa_jobs_unique")
    })
}

/// The engine's error for a server error that another driver reported while running one of
/// the engine's statements (`awa.bridge`: an insert written through the application's own
/// asyncpg, psycopg, SQLAlchemy or Django connection), classified exactly as
/// `From<sqlx::Error>` and the insert path classify sqlx's: the deduplication index is a
/// [`AwaError::UniqueConflict`] for `kind`, a missing object of schema `awa` is
/// [`AwaError::SchemaNotMigrated`]. `None` for any other error: it stays the driver's own.
pub fn classify_server_error(
    code: Option<&str>,
    constraint: Option<&str>,
    message: &str,
    kind: &str,
) -> Option<AwaError> {
    if code == Some("23505") && constraint == Some("idx_awa_jobs_unique") {
        return Some(AwaError::UniqueConflict { kind: kind.into() });
    }
    let missing_object = matches!(code, Some("42P01" | "3F000" | "42883" | "42704"));
    (missing_object && names_awa_object(message)).then(|| AwaError::SchemaNotMigrated {
        detail: message.to_string(),
    })
}

/// Whether a failed finalization may be retried in a new transaction: a deadlock, a
/// serialization failure, or a connection that broke (the commit may or may not have landed).
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                Some("40P01") | Some("40001") | Some("57P01")
            )
        }
        _ => false,
    }
}

pub type Result<T, E = AwaError> = std::result::Result<T, E>;

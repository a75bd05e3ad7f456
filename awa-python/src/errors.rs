//! The one mapping from engine errors to Python exceptions.
//!
//! The exception classes live in the native module but are named as the `awa` package
//! re-exports them (`__module__ == "awa"`, `__qualname__ == "AwaError"`, ...), so tracebacks
//! read `awa.UniqueConflict: ...`, `except awa.UniqueConflict` catches exactly what the engine
//! raises, and pickling finds each class again as `awa.<Name>`.

use awa_core::AwaError as CoreError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

create_exception!(awa, AwaError, PyException, "Base class of every Awa error.");
create_exception!(
    awa,
    UniqueConflict,
    AwaError,
    "A unique job with the same key already exists."
);
create_exception!(
    awa,
    SchemaNotMigrated,
    AwaError,
    "Awa's own schema (or an object in it) is missing; call migrate()."
);
create_exception!(
    awa,
    ForeignSchema,
    SchemaNotMigrated,
    "The database's `awa` schema was created by another implementation (awa-pg); Awa neither \
     migrates nor uses it. A subclass of SchemaNotMigrated, so awa-pg-style `except \
     awa.SchemaNotMigrated` (or `except awa.AwaError`) still catches it."
);
create_exception!(
    awa,
    UnknownJobKind,
    AwaError,
    "No handler is registered for the job's kind."
);
create_exception!(
    awa,
    SerializationError,
    AwaError,
    "Args or a payload did not convert to or from JSON."
);
create_exception!(
    awa,
    ValidationError,
    AwaError,
    "A request or setting broke a rule; the message names the field and the limit."
);
create_exception!(
    awa,
    ConfigError,
    ValidationError,
    "A worker setting (a `start()` keyword or queue entry) is invalid or inconsistent; also a \
     `ValueError`, the class awa-pg raises for these."
);
create_exception!(
    awa,
    TerminalError,
    AwaError,
    "Raise from a handler to fail the job without retrying."
);
create_exception!(
    awa,
    StagingError,
    TerminalError,
    "A follow-up could not be staged (ADR-046)."
);
create_exception!(
    awa,
    DatabaseError,
    AwaError,
    "A database error. The message carries the server's text and SQLSTATE; `.sqlstate` gives \
     the code (None when the error did not come from the server)."
);
create_exception!(
    awa,
    CallbackNotFound,
    AwaError,
    "No waiting job has this callback id."
);
create_exception!(awa, JobNotFound, AwaError, "No job has this id.");

/// Convert an engine error into the matching Python exception.
pub fn to_py(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::Validation(_) | CoreError::BatchOperation(_) | CoreError::InvalidStorage(_) => {
            ValidationError::new_err(msg)
        }
        CoreError::Config(_) => ConfigError::new_err(msg),
        CoreError::Serialization(_) => SerializationError::new_err(msg),
        CoreError::UniqueConflict { .. } => UniqueConflict::new_err(msg),
        CoreError::SchemaNotMigrated { .. } => SchemaNotMigrated::new_err(msg),
        CoreError::ForeignSchema { .. } => ForeignSchema::new_err(msg),
        CoreError::UnknownJobKind(_) => UnknownJobKind::new_err(msg),
        CoreError::JobNotFound(_) => JobNotFound::new_err(msg),
        CoreError::CallbackNotFound(_) => CallbackNotFound::new_err(msg),
        CoreError::Staging(_) => StagingError::new_err(msg),
        // A malformed URL is a DatabaseError, as awa-pg 0.6.9 raises it.
        CoreError::Database(_) | CoreError::Connect(_) | CoreError::InvalidUrl(_) => {
            DatabaseError::new_err(msg)
        }
        CoreError::State(_) | CoreError::Storage(_) | CoreError::StorageRouteMoved(_) => {
            AwaError::new_err(msg)
        }
        // AwaError is non-exhaustive: anything newer is still an AwaError.
        _ => AwaError::new_err(msg),
    }
}

/// Marker the engine writes before a server error's code (`database error (SQLSTATE 42601): ...`).
const SQLSTATE_MARK: &str = "(SQLSTATE ";

/// `DatabaseError.sqlstate`: the code in the message. Kept in the message rather than in a
/// second constructor argument so that `str(exc)`, `exc.args` and pickling stay those of a
/// plain one-message exception.
#[pyfunction]
fn database_error_sqlstate(exc: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let args = exc.getattr("args")?;
    let args = args.cast::<PyTuple>()?;
    let Ok(first) = args.get_item(0) else {
        return Ok(None);
    };
    let Ok(message) = first.extract::<String>() else {
        return Ok(None);
    };
    Ok(message.find(SQLSTATE_MARK).and_then(|at| {
        let code = message.get(at + SQLSTATE_MARK.len()..at + SQLSTATE_MARK.len() + 5)?;
        code.chars()
            .all(|c| c.is_ascii_alphanumeric())
            .then(|| code.to_string())
    }))
}

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AwaError", py.get_type::<AwaError>())?;
    m.add("UniqueConflict", py.get_type::<UniqueConflict>())?;
    m.add("SchemaNotMigrated", py.get_type::<SchemaNotMigrated>())?;
    m.add("ForeignSchema", py.get_type::<ForeignSchema>())?;
    m.add("UnknownJobKind", py.get_type::<UnknownJobKind>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    m.add("ValidationError", py.get_type::<ValidationError>())?;
    // Both a ValidationError and a ValueError (awa-pg raises ValueError for bad settings).
    let config_error = py.get_type::<ConfigError>();
    let bases = PyTuple::new(
        py,
        [
            py.get_type::<ValidationError>().into_any(),
            py.get_type::<pyo3::exceptions::PyValueError>().into_any(),
        ],
    )?;
    config_error.setattr("__bases__", bases)?;
    m.add("ConfigError", config_error)?;
    m.add("TerminalError", py.get_type::<TerminalError>())?;
    m.add("StagingError", py.get_type::<StagingError>())?;
    m.add("DatabaseError", py.get_type::<DatabaseError>())?;
    m.add("CallbackNotFound", py.get_type::<CallbackNotFound>())?;
    m.add("JobNotFound", py.get_type::<JobNotFound>())?;
    // A ValidationError is also a ValueError: code written for awa-pg catches ValueError where
    // it raised one for bad input (`list_jobs(state="nope")`, `retry_failed()` without a
    // filter, a negative callback timeout), and `except ValueError` is what Python code
    // writes for a bad argument value. Set once here so every raise of the class has it.
    let value_error = py.get_type::<pyo3::exceptions::PyValueError>();
    py.get_type::<ValidationError>()
        .setattr("__bases__", (py.get_type::<AwaError>(), value_error))?;
    let getter = wrap_pyfunction!(database_error_sqlstate, m)?;
    let property = py
        .import("builtins")?
        .getattr("property")?
        .call1((getter,))?;
    py.get_type::<DatabaseError>()
        .setattr("sqlstate", property)?;
    Ok(())
}

/// `Result` with the engine error, for `?` inside futures.
pub trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T, E: Into<CoreError>> IntoPyResult<T> for Result<T, E> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(e.into()))
    }
}

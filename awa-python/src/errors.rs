//! The one mapping from engine errors to Python exceptions.
//!
//! The exception classes live in the native module and are re-exported by the `awa` package,
//! so `except awa.UniqueConflict` catches exactly what the engine raises.

use awa_core::AwaError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _awa,
    AwaErrorPy,
    PyException,
    "Base class of every Awa error."
);
create_exception!(
    _awa,
    UniqueConflict,
    AwaErrorPy,
    "A unique job with the same key already exists."
);
create_exception!(
    _awa,
    SchemaNotMigrated,
    AwaErrorPy,
    "The awa schema is missing; call migrate()."
);
create_exception!(
    _awa,
    UnknownJobKind,
    AwaErrorPy,
    "No handler is registered for the job's kind."
);
create_exception!(
    _awa,
    SerializationError,
    AwaErrorPy,
    "Args or a payload did not convert to or from JSON."
);
create_exception!(
    _awa,
    ValidationError,
    AwaErrorPy,
    "An insert request broke a rule."
);
create_exception!(
    _awa,
    TerminalError,
    AwaErrorPy,
    "Raise from a handler to fail the job without retrying."
);
create_exception!(
    _awa,
    StagingError,
    TerminalError,
    "A follow-up could not be staged (ADR-046)."
);
create_exception!(_awa, DatabaseError, AwaErrorPy, "A database error.");
create_exception!(
    _awa,
    CallbackNotFound,
    AwaErrorPy,
    "No waiting job has this callback id."
);
create_exception!(_awa, JobNotFound, AwaErrorPy, "No job has this id.");

/// Convert an engine error into the matching Python exception.
pub fn to_py(e: AwaError) -> PyErr {
    let msg = e.to_string();
    match e {
        AwaError::Validation(_) | AwaError::Config(_) => ValidationError::new_err(msg),
        AwaError::Serialization(_) => SerializationError::new_err(msg),
        AwaError::UniqueConflict { .. } => UniqueConflict::new_err(msg),
        AwaError::SchemaNotMigrated => SchemaNotMigrated::new_err(msg),
        AwaError::UnknownJobKind(_) => UnknownJobKind::new_err(msg),
        AwaError::JobNotFound(_) => JobNotFound::new_err(msg),
        AwaError::CallbackNotFound(_) => CallbackNotFound::new_err(msg),
        AwaError::Staging(_) => StagingError::new_err(msg),
        AwaError::Database(_) => DatabaseError::new_err(msg),
        AwaError::State(_) => AwaErrorPy::new_err(msg),
        // AwaError is non-exhaustive: anything newer is still an AwaError.
        _ => AwaErrorPy::new_err(msg),
    }
}

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AwaError", py.get_type::<AwaErrorPy>())?;
    m.add("UniqueConflict", py.get_type::<UniqueConflict>())?;
    m.add("SchemaNotMigrated", py.get_type::<SchemaNotMigrated>())?;
    m.add("UnknownJobKind", py.get_type::<UnknownJobKind>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    m.add("ValidationError", py.get_type::<ValidationError>())?;
    m.add("TerminalError", py.get_type::<TerminalError>())?;
    m.add("StagingError", py.get_type::<StagingError>())?;
    m.add("DatabaseError", py.get_type::<DatabaseError>())?;
    m.add("CallbackNotFound", py.get_type::<CallbackNotFound>())?;
    m.add("JobNotFound", py.get_type::<JobNotFound>())?;
    Ok(())
}

/// `Result` with the engine error, for `?` inside futures.
pub trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T, E: Into<AwaError>> IntoPyResult<T> for Result<T, E> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(e.into()))
    }
}

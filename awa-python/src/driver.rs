//! `awa.bridge`'s native half: an insert that the application's own driver writes.
//!
//! The job is validated and its unique key computed here, by the same code as every other
//! insert (`UntypedRequest` → `NewJob`); Python only runs the statement on the caller's
//! connection (asyncpg, psycopg, SQLAlchemy, Django), inside the caller's transaction, and
//! hands any server error back to [`driver_error`] so it is classified as the engine's own.

use crate::client::parse_requests;
use crate::errors::to_py;
use awa_core::storage::insert::{driver_insert_params, DRIVER_INSERT};
use pyo3::prelude::*;

/// Validate one JSON request (as `insert` builds it) into the bridge statement (placeholders
/// `$1`..`$11`, each used once) and its text parameters. Raises what `insert` raises for the
/// same request (`ValidationError`, `SerializationError`) before anything reaches the driver.
#[pyfunction]
pub(crate) fn driver_insert(request: String) -> PyResult<(&'static str, Vec<Option<String>>)> {
    let job = parse_requests(std::slice::from_ref(&request))?
        .pop()
        .ok_or_else(|| to_py(awa_core::AwaError::State("no job in the request".into())))?;
    Ok((DRIVER_INSERT, driver_insert_params(&job)))
}

/// The Awa exception for a server error the driver raised while running the bridge
/// statement (`UniqueConflict`, `SchemaNotMigrated`), or None when it stays the driver's.
#[pyfunction]
#[pyo3(signature = (kind, code, constraint, message))]
pub(crate) fn driver_error(
    py: Python<'_>,
    kind: &str,
    code: Option<&str>,
    constraint: Option<&str>,
    message: &str,
) -> Option<Py<PyAny>> {
    awa_core::error::classify_server_error(code, constraint, message, kind)
        .map(|e| to_py(e).into_value(py).into_any())
}

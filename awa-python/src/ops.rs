//! What the `awa` command line needs from the engine beyond the client calls: the embedded
//! migration scripts (`awa migrate --sql`, `--extract-to`, no database needed) and moving
//! failed jobs into the dead-letter queue (`awa dlq move`) with the engine's own statement.

use pyo3::prelude::*;

use crate::bridge;
use crate::client::NativeClient;
use crate::errors::IntoPyResult;
use awa_core::storage::{dlq, migrations};
use awa_core::AwaError;

/// The SQL bringing a schema at version `from` to version `to` (inclusive), as one script.
#[pyfunction]
fn migration_sql(from_version: i32, to_version: i32) -> String {
    migrations::range_sql(from_version, to_version)
}

/// Every embedded migration as `(version, sql)`, in order.
#[pyfunction]
fn migration_scripts() -> Vec<(i32, &'static str)> {
    migrations::scripts().to_vec()
}

/// Move the failed jobs among `ids` into the DLQ with `reason`, in one transaction; resolves
/// to how many moved (jobs that are not `failed` any more stay where they are).
#[pyfunction]
fn dlq_move<'py>(
    py: Python<'py>,
    client: &NativeClient,
    ids: Vec<i64>,
    reason: String,
) -> PyResult<Bound<'py, PyAny>> {
    let pool = client.pool.clone();
    bridge::spawn(py, async move {
        let moved = async {
            let mut tx = pool.begin().await?;
            let moved = dlq::move_to_dlq_anywhere(&mut tx, &ids, &reason).await?;
            tx.commit().await?;
            Ok::<u64, AwaError>(moved)
        };
        moved.await.py_err()
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(migration_sql, m)?)?;
    m.add_function(wrap_pyfunction!(migration_scripts, m)?)?;
    m.add_function(wrap_pyfunction!(dlq_move, m)?)?;
    Ok(())
}

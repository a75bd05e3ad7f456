//! `NativeTransaction`: a caller-owned transaction for raw SQL and transactional enqueue.
//!
//! # Failed transactions never pretend to commit
//! PostgreSQL answers `COMMIT` of a transaction in which a statement failed with a silent
//! rollback. So every statement error is remembered here, and `commit()` after one asks the
//! server whether the transaction is still usable (the caller may have recovered with its own
//! `SAVEPOINT`/`ROLLBACK TO`); if it is not, the transaction is rolled back and `commit()`
//! raises `awa.DatabaseError` with SQLSTATE 25P02 naming the first failure.
//!
//! # Unique inserts run under a savepoint
//! A `UniqueConflict` is an expected answer, not a broken transaction: an insert of jobs
//! with a unique key runs inside `SAVEPOINT`, and a conflict rolls back to it, so the
//! transaction stays usable and its earlier and later work commits.

use crate::bridge;
use crate::client::{jobs_json, join, parse_requests, Copied, CopyBatch};
use crate::convert::{decode_row, row_to_dict, rows_to_py, Param};
use crate::errors::{AwaError as AwaErrorPy, DatabaseError, IntoPyResult};
use awa_core::storage::routing;
use awa_core::{AwaError, NewJob};
use pyo3::prelude::*;
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use std::sync::Arc;
use tokio::sync::Mutex;

/// The open transaction (None once committed or rolled back) and the first statement error
/// seen in it.
struct TxState {
    tx: Option<Transaction<'static, Postgres>>,
    failure: Option<Failure>,
}

/// A statement of the transaction failed on the server.
struct Failure {
    message: String,
    /// A failed job insert: the transaction can no longer commit, whatever the caller does.
    /// A failed `execute`/`fetch_*` statement is not sticky: the caller may have recovered
    /// with its own savepoint, and `commit()` asks the server.
    sticky: bool,
}

impl TxState {
    fn open(&mut self) -> Result<&mut Transaction<'static, Postgres>, AwaError> {
        self.tx
            .as_mut()
            .ok_or_else(|| AwaError::State(CLOSED.into()))
    }

    /// Remember `e` if it came from the database (the transaction may now be aborted).
    fn note<T>(&mut self, result: Result<T, AwaError>) -> Result<T, AwaError> {
        self.record(result, false)
    }

    /// Remember a failed job insert: `commit()` will roll back and raise. A `UniqueConflict`
    /// is not a failure (its savepoint was rolled back to).
    fn note_insert<T>(&mut self, result: Result<T, AwaError>) -> Result<T, AwaError> {
        self.record(result, true)
    }

    fn record<T>(&mut self, result: Result<T, AwaError>, sticky: bool) -> Result<T, AwaError> {
        if let Err(e) = &result {
            if touched_the_server(e) {
                match &mut self.failure {
                    Some(first) => first.sticky |= sticky,
                    None => {
                        self.failure = Some(Failure {
                            message: e.to_string(),
                            sticky,
                        })
                    }
                }
            }
        }
        result
    }
}

/// Errors that mean a statement reached (or may have reached) the server and failed there.
/// Validation and serialization errors happen before any statement is sent.
fn touched_the_server(e: &AwaError) -> bool {
    matches!(
        e,
        AwaError::Database(_) | AwaError::SchemaNotMigrated { .. }
    )
}

/// `in_failed_sql_transaction`: the transaction is aborted until it ends.
fn is_aborted(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("25P02"))
}

type Slot = Arc<Mutex<TxState>>;

#[pyclass(module = "awa._awa")]
pub struct NativeTransaction {
    state: Slot,
    /// The client's pool handle: where inserts go (`awa_core::storage::routing`).
    db: awa_core::Db,
}

impl NativeTransaction {
    pub fn new(tx: Transaction<'static, Postgres>, db: awa_core::Db) -> Self {
        NativeTransaction {
            state: Arc::new(Mutex::new(TxState {
                tx: Some(tx),
                failure: None,
            })),
            db,
        }
    }
}

const CLOSED: &str = "the transaction is already committed or rolled back";

fn closed() -> PyErr {
    AwaErrorPy::new_err(CLOSED)
}

fn extract_params(params: &[Bound<'_, PyAny>]) -> PyResult<Vec<Param>> {
    params.iter().map(Param::extract).collect()
}

/// How many rows a fetch expects.
#[derive(Clone, Copy)]
enum Fetch {
    One,
    Optional,
    All,
}

/// The two ways a transaction inserts jobs.
#[derive(Clone, Copy)]
enum InsertHow {
    /// One statement returning the rows.
    Rows,
    /// One COPY; the rows too when `returning`.
    Copy { returning: bool },
}

enum Inserted {
    Rows(Vec<awa_core::JobRow>),
    Copied(Copied),
}

async fn insert_once(
    conn: &mut PgConnection,
    db: &awa_core::Db,
    jobs: &[NewJob],
    how: InsertHow,
) -> Result<Inserted, AwaError> {
    match how {
        InsertHow::Rows => Ok(Inserted::Rows(
            routing::insert_jobs_in(conn, db, jobs).await?,
        )),
        InsertHow::Copy { returning } => Ok(Inserted::Copied(
            Copied::copy(conn, db, jobs, returning).await?,
        )),
    }
}

/// Insert on the transaction's connection; when any job has a unique key, inside a savepoint
/// that a `UniqueConflict` rolls back to (leaving the transaction usable).
async fn insert_guarded(
    conn: &mut PgConnection,
    db: &awa_core::Db,
    jobs: &[NewJob],
    how: InsertHow,
) -> Result<Inserted, AwaError> {
    if !jobs.iter().any(|j| j.unique_key.is_some()) {
        return insert_once(conn, db, jobs, how).await;
    }
    let mut savepoint = conn.begin().await?;
    match insert_once(&mut savepoint, db, jobs, how).await {
        Ok(value) => {
            savepoint.commit().await?;
            Ok(value)
        }
        Err(e @ AwaError::UniqueConflict { .. }) => {
            savepoint.rollback().await?;
            Err(e)
        }
        // The caller records the failure as sticky: the transaction will not commit.
        Err(e) => Err(e),
    }
}

impl NativeTransaction {
    fn fetch<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
        mode: Fetch,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = extract_params(&params)?;
        let slot = self.state.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.tx.as_mut().ok_or_else(closed)?;
            let mut q = sqlx::query(&sql);
            for p in params {
                q = p.bind(q);
            }
            let result = q.fetch_all(&mut **tx).await.map_err(AwaError::from);
            let rows = guard.note(result).py_err()?;
            drop(guard);
            let decoded = rows
                .iter()
                .map(decode_row)
                .collect::<Result<Vec<_>, _>>()
                .map_err(crate::errors::SerializationError::new_err)?;
            Python::attach(|py| match mode {
                Fetch::All => rows_to_py(py, decoded),
                Fetch::One | Fetch::Optional => {
                    let mut it = decoded.into_iter();
                    match it.next() {
                        Some(row) => row_to_dict(py, row),
                        None if matches!(mode, Fetch::Optional) => Ok(py.None()),
                        None => Err(DatabaseError::new_err(
                            "fetch_one: the query returned no rows",
                        )),
                    }
                }
            })
        })
    }
}

#[pymethods]
impl NativeTransaction {
    #[pyo3(signature = (sql, params))]
    fn execute<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = extract_params(&params)?;
        let slot = self.state.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.tx.as_mut().ok_or_else(closed)?;
            let mut q = sqlx::query(&sql);
            for p in params {
                q = p.bind(q);
            }
            let result = q.execute(&mut **tx).await.map_err(AwaError::from);
            let done = guard.note(result).py_err()?;
            Ok(done.rows_affected())
        })
    }

    #[pyo3(signature = (sql, params))]
    fn fetch_one<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.fetch(py, sql, params, Fetch::One)
    }

    #[pyo3(signature = (sql, params))]
    fn fetch_optional<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.fetch(py, sql, params, Fetch::Optional)
    }

    #[pyo3(signature = (sql, params))]
    fn fetch_all<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.fetch(py, sql, params, Fetch::All)
    }

    fn insert_many<'py>(
        &self,
        py: Python<'py>,
        requests: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let jobs = parse_requests(&requests)?;
        let slot = self.state.clone();
        let db = self.db.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.tx.as_mut().ok_or_else(closed)?;
            let result = insert_guarded(tx, &db, &jobs, InsertHow::Rows).await;
            match guard.note_insert(result).py_err()? {
                Inserted::Rows(rows) => jobs_json(&rows),
                Inserted::Copied(_) => Err(AwaErrorPy::new_err("insert returned no rows")),
            }
        })
    }

    #[pyo3(signature = (kinds, args_json, options_json, own_options = None, returning = false))]
    fn insert_many_copy<'py>(
        &self,
        py: Python<'py>,
        kinds: Vec<String>,
        args_json: String,
        options_json: String,
        own_options: Option<Vec<Option<String>>>,
        returning: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let batch = CopyBatch::new(kinds, args_json, options_json, own_options);
        let slot = self.state.clone();
        let db = self.db.clone();
        bridge::spawn(py, async move {
            join(tokio::spawn(async move {
                let jobs = batch.into_jobs()?;
                let mut guard = slot.lock_owned().await;
                let tx = guard.open()?;
                if jobs.is_empty() {
                    return Copied::empty(returning);
                }
                let result = insert_guarded(tx, &db, &jobs, InsertHow::Copy { returning }).await;
                match guard.note_insert(result)? {
                    Inserted::Copied(copied) => Ok(copied),
                    Inserted::Rows(_) => Err(AwaError::State("COPY returned rows".into())),
                }
            }))
            .await
        })
    }

    /// Commit; after a failed statement that left the transaction aborted, roll back instead
    /// and raise `DatabaseError` (SQLSTATE 25P02) saying why.
    fn commit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.state.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let mut tx = guard.tx.take().ok_or_else(closed)?;
            let Some(failure) = guard.failure.take() else {
                return tx.commit().await.map_err(AwaError::from).py_err();
            };
            // A failed execute/fetch leaves the transaction usable if the caller rolled back
            // to a savepoint of its own; the probe fails with 25P02 when it is aborted.
            if !failure.sticky {
                match sqlx::query("SELECT 1").execute(&mut *tx).await {
                    Ok(_) => return tx.commit().await.map_err(AwaError::from).py_err(),
                    Err(e) if !is_aborted(&e) => {
                        let _ = tx.rollback().await;
                        return Err(AwaError::from(e)).py_err();
                    }
                    Err(_) => {}
                }
            }
            // The rollback's own error (a lost connection) changes nothing: the server
            // discards an aborted transaction either way.
            let _ = tx.rollback().await;
            Err(DatabaseError::new_err(format!(
                "database error (SQLSTATE 25P02): the transaction was rolled back and nothing \
                 was committed, because an earlier statement failed: {}",
                failure.message
            )))
        })
    }

    fn rollback<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.state.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.tx.take().ok_or_else(closed)?;
            guard.failure = None;
            tx.rollback().await.map_err(AwaError::from).py_err()
        })
    }

    /// Whether commit or rollback has run.
    fn is_closed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.state.clone();
        bridge::spawn(py, async move { Ok(slot.lock().await.tx.is_none()) })
    }
}

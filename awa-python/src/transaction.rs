//! `NativeTransaction`: a caller-owned transaction for raw SQL and transactional enqueue.

use crate::bridge;
use crate::client::{jobs_json, join, parse_requests, Copied, CopyBatch};
use crate::convert::{decode_row, row_to_dict, rows_to_py, Param};
use crate::errors::{AwaErrorPy, DatabaseError, IntoPyResult};
use awa_core::AwaError;
use pyo3::prelude::*;
use sqlx::{Postgres, Transaction};
use std::sync::Arc;
use tokio::sync::Mutex;

type Slot = Arc<Mutex<Option<Transaction<'static, Postgres>>>>;

#[pyclass(module = "awa._awa")]
pub struct NativeTransaction {
    tx: Slot,
}

impl NativeTransaction {
    pub fn new(tx: Transaction<'static, Postgres>) -> Self {
        NativeTransaction {
            tx: Arc::new(Mutex::new(Some(tx))),
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

impl NativeTransaction {
    fn fetch<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
        mode: Fetch,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = extract_params(&params)?;
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.as_mut().ok_or_else(closed)?;
            let mut q = sqlx::query(&sql);
            for p in params {
                q = p.bind(q);
            }
            let rows = q
                .fetch_all(&mut **tx)
                .await
                .map_err(AwaError::from)
                .py_err()?;
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
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.as_mut().ok_or_else(closed)?;
            let mut q = sqlx::query(&sql);
            for p in params {
                q = p.bind(q);
            }
            let done = q
                .execute(&mut **tx)
                .await
                .map_err(AwaError::from)
                .py_err()?;
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
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            let mut guard = slot.lock().await;
            let tx = guard.as_mut().ok_or_else(closed)?;
            let rows = awa_core::insert_jobs(&mut **tx, &jobs).await.py_err()?;
            jobs_json(&rows)
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
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            join(tokio::spawn(async move {
                let jobs = batch.into_jobs()?;
                let mut guard = slot.lock_owned().await;
                let tx = guard
                    .as_mut()
                    .ok_or_else(|| AwaError::State(CLOSED.into()))?;
                if jobs.is_empty() {
                    return Copied::empty(returning);
                }
                Copied::copy(tx, &jobs, returning).await
            }))
            .await
        })
    }

    fn commit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            let tx = slot.lock().await.take().ok_or_else(closed)?;
            tx.commit().await.map_err(AwaError::from).py_err()
        })
    }

    fn rollback<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.tx.clone();
        bridge::spawn(py, async move {
            let tx = slot.lock().await.take().ok_or_else(closed)?;
            tx.rollback().await.map_err(AwaError::from).py_err()
        })
    }

    /// Whether commit or rollback has run.
    fn is_closed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let slot = self.tx.clone();
        bridge::spawn(py, async move { Ok(slot.lock().await.is_none()) })
    }
}

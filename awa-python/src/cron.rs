//! Periodic jobs for the Python package (`python/awa/_cron.py`): checking a registration,
//! upserting the registrations at start, and the schedule operations.
//!
//! Module functions taking the `NativeClient` rather than methods on it, so the bindings of
//! this feature stay in one file. Each operation has an awaitable form and a blocking `_sync`
//! form (awa-pg's client offers both); the blocking one releases the GIL while it waits.

use crate::client::NativeClient;
use crate::errors::IntoPyResult;
use awa_core::cron::{self, MissedFirePolicy, PeriodicJob};
use awa_core::model::UntypedRequest;
use awa_core::storage::pool::Db;
use awa_core::AwaError;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use serde::Deserialize;
use std::future::Future;

/// One registration as `_cron.py` sends it: the schedule plus the insert request (built by
/// `build_request`, so args and options are converted exactly as for `insert()`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Registration {
    name: String,
    cron_expr: String,
    timezone: String,
    missed_fire_policy: String,
    request: String,
}

impl Registration {
    fn into_periodic(self) -> Result<PeriodicJob, AwaError> {
        let context = |e: String| AwaError::Config(format!("periodic job {:?}: {e}", self.name));
        let request =
            UntypedRequest::from_json(&self.request).map_err(|e| context(e.to_string()))?;
        let opts = request.opts().map_err(|e| context(e.to_string()))?;
        let policy = MissedFirePolicy::parse(&self.missed_fire_policy)
            .map_err(|e| context(e.to_string()))?;
        let job = PeriodicJob::untyped(&self.name, &self.cron_expr, request.kind, request.args)
            .timezone(&self.timezone)
            .opts(opts)
            .missed_fire_policy(policy);
        job.validate()?;
        Ok(job)
    }
}

fn parse(registration: &str) -> Result<PeriodicJob, AwaError> {
    let r: Registration = serde_json::from_str(registration)
        .map_err(|e| AwaError::Config(format!("periodic registration: {e}")))?;
    r.into_periodic()
}

/// Check one registration (JSON) without touching the database; raises
/// `awa.ValidationError` naming the schedule and what is wrong with it.
#[pyfunction]
pub fn cron_check(registration: &str) -> PyResult<()> {
    parse(registration).map(|_| ()).py_err()
}

/// Upsert the registrations (JSON each) into `awa.cron_jobs`.
#[pyfunction]
pub fn cron_upsert<'py>(
    py: Python<'py>,
    client: PyRef<'py, NativeClient>,
    registrations: Vec<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let jobs = registrations
        .iter()
        .map(|r| parse(r))
        .collect::<Result<Vec<_>, _>>()
        .py_err()?;
    let pool = client.pool.clone();
    let check = client.schema_check();
    crate::bridge::spawn(py, async move {
        check.await.py_err()?;
        cron::upsert(&pool, &jobs).await.py_err()
    })
}

/// Run an operation as an awaitable, or block on it with the GIL released; either way after
/// the client's foreign-schema check (`NativeClient::schema_check`).
fn run<'py, F, Fut, T>(
    py: Python<'py>,
    client: &NativeClient,
    blocking: bool,
    op: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: FnOnce(Db) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, AwaError>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let pool = client.pool.clone();
    let check = client.schema_check();
    let checked = async move {
        check.await?;
        op(pool).await
    };
    if blocking {
        let runtime = pyo3_async_runtimes::tokio::get_runtime();
        let value = py.detach(|| runtime.block_on(checked)).py_err()?;
        return value.into_bound_py_any(py);
    }
    crate::bridge::spawn(py, async move { checked.await.py_err() })
}

/// Every schedule as a JSON list (what awa-pg's native `list_cron_jobs` returns).
#[pyfunction]
#[pyo3(signature = (client, blocking = false))]
pub fn cron_list<'py>(
    py: Python<'py>,
    client: PyRef<'py, NativeClient>,
    blocking: bool,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, &client, blocking, |pool| async move {
        let rows = cron::list(&pool).await?;
        Ok(serde_json::to_string(&rows)?)
    })
}

/// Delete a schedule; `True` when it existed.
#[pyfunction]
#[pyo3(signature = (client, name, blocking = false))]
pub fn cron_delete<'py>(
    py: Python<'py>,
    client: PyRef<'py, NativeClient>,
    name: String,
    blocking: bool,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, &client, blocking, |pool| async move {
        cron::delete(&pool, &name).await
    })
}

/// Pause or resume a schedule; `True` when it exists.
#[pyfunction]
#[pyo3(signature = (client, name, paused, blocking = false))]
pub fn cron_set_paused<'py>(
    py: Python<'py>,
    client: PyRef<'py, NativeClient>,
    name: String,
    paused: bool,
    blocking: bool,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, &client, blocking, move |pool| async move {
        cron::set_paused(&pool, &name, paused).await
    })
}

/// Enqueue a schedule's job now; the job as JSON, or `None` when there is no such schedule.
#[pyfunction]
#[pyo3(signature = (client, name, blocking = false))]
pub fn cron_trigger<'py>(
    py: Python<'py>,
    client: PyRef<'py, NativeClient>,
    name: String,
    blocking: bool,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, &client, blocking, |pool| async move {
        match cron::trigger(&pool, &name).await? {
            Some(job) => Ok(Some(serde_json::to_string(&job)?)),
            None => Ok(None),
        }
    })
}

/// Register the functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cron_check, m)?)?;
    m.add_function(wrap_pyfunction!(cron_upsert, m)?)?;
    m.add_function(wrap_pyfunction!(cron_list, m)?)?;
    m.add_function(wrap_pyfunction!(cron_delete, m)?)?;
    m.add_function(wrap_pyfunction!(cron_set_paused, m)?)?;
    m.add_function(wrap_pyfunction!(cron_trigger, m)?)?;
    Ok(())
}

//! `NativeClient`: the pool plus every call the Python `AsyncClient` makes.
//!
//! Each method extracts its Python arguments while it holds the GIL, then returns an awaitable
//! whose work runs on the Tokio runtime without the GIL. Jobs cross back as JSON text that the
//! Python package turns into `awa.Job` objects.

use crate::bridge;
use crate::convert::Param;
use crate::errors::IntoPyResult;
use crate::transaction::NativeTransaction;
use awa_core::model::{UntypedOpts, UntypedRequest};
use awa_core::storage::{admin, callbacks, dlq};
use awa_core::{AwaError, JobFilter, JobRow, JobState, NewJob};
use awa_core::{QueueConfig, RuntimeConfig};
use pyo3::prelude::*;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Parse the JSON requests built by the Python package and validate them.
pub fn parse_requests(requests: &[String]) -> PyResult<Vec<NewJob>> {
    requests
        .iter()
        .map(|r| UntypedRequest::from_json(r).and_then(UntypedRequest::into_new_job))
        .collect::<Result<Vec<_>, _>>()
        .py_err()
}

/// The jobs of a bulk COPY call as the Python package sends them (`copy_batch` in
/// `_convert.py`): one kind per job, every job's args as one JSON array, the shared options
/// once, and the options of the jobs that have their own. Parsed and validated on the runtime,
/// off the GIL, by the same validator as every other insert.
pub(crate) struct CopyBatch {
    kinds: Vec<String>,
    args_json: String,
    options_json: String,
    own_options: Option<Vec<Option<String>>>,
}

impl CopyBatch {
    pub(crate) fn new(
        kinds: Vec<String>,
        args_json: String,
        options_json: String,
        own_options: Option<Vec<Option<String>>>,
    ) -> Self {
        CopyBatch {
            kinds,
            args_json,
            options_json,
            own_options,
        }
    }

    pub(crate) fn into_jobs(self) -> Result<Vec<NewJob>, AwaError> {
        let args: Vec<serde_json::Value> = serde_json::from_str(&self.args_json)?;
        let n = self.kinds.len();
        let own_len = self.own_options.as_ref().map_or(n, Vec::len);
        if args.len() != n || own_len != n {
            return Err(AwaError::Serialization(format!(
                "a COPY batch of {n} kinds came with {} args and {own_len} options",
                args.len()
            )));
        }
        let shared = UntypedOpts::from_json(&self.options_json)?.into_insert_opts()?;
        let mut own = self.own_options.map(Vec::into_iter);
        let mut jobs = Vec::with_capacity(n);
        for (kind, args) in self.kinds.iter().zip(args) {
            let job = match own.as_mut().and_then(Iterator::next).flatten() {
                Some(text) => {
                    let opts = UntypedOpts::from_json(&text)?.into_insert_opts()?;
                    awa_core::model::validate(kind, args, &opts)?
                }
                None => awa_core::model::validate(kind, args, &shared)?,
            };
            jobs.push(job);
        }
        Ok(jobs)
    }
}

/// Wait for a task spawned so that it runs to its end even if the awaiting Python task is
/// cancelled (a COPY stopped mid-stream would leave its connection unusable).
/// What a COPY call hands back to Python: the count (`enqueue_many_copy`), or the rows as
/// JSON (`insert_many_copy`).
pub(crate) enum Copied {
    Count(u64),
    Rows(String),
}

impl Copied {
    pub(crate) fn empty(returning: bool) -> Result<Copied, AwaError> {
        Ok(if returning {
            Copied::Rows("[]".into())
        } else {
            Copied::Count(0)
        })
    }

    /// Run the COPY on `conn` (a pooled connection or a caller's transaction).
    pub(crate) async fn copy(
        conn: &mut sqlx::PgConnection,
        jobs: &[NewJob],
        returning: bool,
    ) -> Result<Copied, AwaError> {
        if returning {
            let rows = awa_core::insert_many_copy_returning(conn, jobs).await?;
            Ok(Copied::Rows(serde_json::to_string(&rows)?))
        } else {
            Ok(Copied::Count(awa_core::insert_many_copy(conn, jobs).await?))
        }
    }
}

impl<'py> IntoPyObject<'py> for Copied {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Copied::Count(n) => n.into_pyobject(py)?.into_any(),
            Copied::Rows(text) => text.into_pyobject(py)?.into_any(),
        })
    }
}

pub(crate) async fn join<T>(task: tokio::task::JoinHandle<Result<T, AwaError>>) -> PyResult<T> {
    task.await
        .map_err(|e| AwaError::State(format!("the insert task ended abnormally: {e}")))
        .and_then(|r| r)
        .py_err()
}

pub fn job_json(job: &JobRow) -> PyResult<String> {
    serde_json::to_string(job).map_err(AwaError::from).py_err()
}

pub fn jobs_json(jobs: &[JobRow]) -> PyResult<String> {
    serde_json::to_string(jobs).map_err(AwaError::from).py_err()
}

/// Run `fut` on the runtime and return its result to Python as JSON text.
fn json_future<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = Result<T, AwaError>> + Send + 'static,
    T: serde::Serialize + Send + 'static,
{
    bridge::spawn(py, async move {
        let value = fut.await.py_err()?;
        serde_json::to_string(&value)
            .map_err(AwaError::from)
            .py_err()
    })
}

/// Worker settings sent by the Python package as JSON. Every number is read as a float and
/// range-checked by name (`awa_core::executor::config::check_setting`), so a negative, huge or
/// fractional count is a `ValidationError` naming the field, not a deserialization error.
#[derive(serde::Deserialize)]
struct StartConfig {
    queues: Vec<QueueSpec>,
    #[serde(default)]
    intervals: std::collections::HashMap<String, f64>,
    #[serde(default)]
    claim_batch: Option<f64>,
    #[serde(default)]
    completion_batch: Option<f64>,
    /// `RuntimeConfig::batch_follow_ups` (an addition to awa-pg's `start()`).
    #[serde(default)]
    batch_follow_ups: Option<bool>,
}

#[derive(serde::Deserialize)]
struct QueueSpec {
    name: String,
    max_workers: f64,
    #[serde(default)]
    deadline_ms: Option<f64>,
    #[serde(default)]
    dlq: bool,
}

fn runtime_config(cfg: &StartConfig) -> Result<RuntimeConfig, AwaError> {
    use awa_core::executor::config::{check_setting, setting_count, setting_millis};
    let mut rc = RuntimeConfig::default();
    for (key, value) in &cfg.intervals {
        let ms = || setting_millis(key, *value);
        match key.as_str() {
            "poll_interval_ms" => rc.poll_interval = ms()?,
            "heartbeat_interval_ms" => rc.heartbeat_interval = ms()?,
            "heartbeat_staleness_ms" => rc.heartbeat_staleness = ms()?,
            "heartbeat_rescue_interval_ms" => rc.heartbeat_rescue_interval = ms()?,
            "deadline_rescue_interval_ms" => rc.deadline_rescue_interval = ms()?,
            "callback_rescue_interval_ms" => rc.callback_rescue_interval = ms()?,
            "promote_interval_ms" => rc.promote_interval = ms()?,
            "leader_election_interval_ms" => rc.leader_election_interval = ms()?,
            "prune_interval_ms" => rc.prune_interval = ms()?,
            "finalize_deadline_ms" => rc.finalize_deadline = ms()?,
            "completed_retention_hours" | "failed_retention_hours" => {
                let hours = Duration::from_secs_f64(check_setting(key, *value)? * 3600.0);
                if key == "completed_retention_hours" {
                    rc.completed_retention = hours;
                } else {
                    rc.failed_retention = hours;
                }
            }
            other => return Err(AwaError::Config(format!("unknown setting {other}"))),
        }
    }
    if let Some(b) = cfg.claim_batch {
        rc.claim_batch = setting_count("claim_batch", b)?;
    }
    if let Some(b) = cfg.completion_batch {
        rc.completion_batch = setting_count("completion_batch", b)?;
    }
    if let Some(on) = cfg.batch_follow_ups {
        rc.batch_follow_ups = on;
    }
    Ok(rc)
}

/// A queue's settings, range-checked and named in the error.
fn queue_config(q: &QueueSpec) -> Result<QueueConfig, AwaError> {
    use awa_core::executor::config::{setting_count, setting_millis};
    let named = |e: AwaError| AwaError::Config(format!("queue {:?}: {e}", q.name));
    let workers = setting_count("max_workers", q.max_workers).map_err(named)?;
    let mut qc = QueueConfig::new(workers).dlq(q.dlq);
    if let Some(ms) = q.deadline_ms {
        qc = qc.deadline(setting_millis("deadline_ms", ms).map_err(named)?);
    }
    Ok(qc)
}

/// Check one numeric setting (`start()` keywords, `shutdown(timeout_ms)`, callback
/// `timeout_seconds`) against the engine's range; returns it, or raises `ValidationError`
/// naming the field and the range.
#[pyfunction]
pub(crate) fn check_setting(field: &str, value: f64) -> PyResult<f64> {
    awa_core::executor::config::check_setting(field, value).py_err()
}

#[pyclass(module = "awa._awa")]
pub struct NativeClient {
    pub(crate) pool: PgPool,
}

#[pymethods]
impl NativeClient {
    /// Create a lazily connecting pool; nothing touches the network until the first call.
    #[new]
    #[pyo3(signature = (database_url, max_connections = 10))]
    fn new(database_url: &str, max_connections: u32) -> PyResult<Self> {
        let _guard = pyo3_async_runtimes::tokio::get_runtime().enter();
        let pool = awa_core::pool_options()
            .max_connections(max_connections.max(1))
            .connect_lazy(database_url)
            .map_err(AwaError::from)
            .py_err()?;
        Ok(NativeClient { pool })
    }

    fn migrate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        bridge::spawn(py, async move { awa_core::migrate(&pool).await.py_err() })
    }

    /// Insert many requests in one statement (all or nothing); returns a JSON list.
    fn insert_many<'py>(
        &self,
        py: Python<'py>,
        requests: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let jobs = parse_requests(&requests)?;
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let rows = awa_core::insert_jobs(&pool, &jobs).await.py_err()?;
            jobs_json(&rows)
        })
    }

    /// Insert a batch with one COPY (all or nothing); returns the number of rows written, or
    /// with `returning` the rows as JSON.
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
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            join(tokio::spawn(async move {
                let jobs = batch.into_jobs()?;
                if jobs.is_empty() {
                    return Copied::empty(returning);
                }
                let mut conn = pool.acquire().await?;
                Copied::copy(&mut conn, &jobs, returning).await
            }))
            .await
        })
    }

    fn get_job<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let job = awa_core::get_job(&pool, job_id).await.py_err()?;
            job_json(&job)
        })
    }

    #[pyo3(signature = (state = None, kind = None, queue = None, limit = 100))]
    fn list_jobs<'py>(
        &self,
        py: Python<'py>,
        state: Option<String>,
        kind: Option<String>,
        queue: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let state = state
            .map(|s| s.parse::<JobState>())
            .transpose()
            .map_err(|e| crate::errors::ValidationError::new_err(e.to_string()))?;
        let filter = JobFilter {
            state,
            kind,
            queue,
            limit: Some(limit),
        };
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let jobs = awa_core::list_jobs(&pool, &filter).await.py_err()?;
            jobs_json(&jobs)
        })
    }

    /// Open a transaction.
    fn transaction<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let tx = pool.begin().await.map_err(AwaError::from).py_err()?;
            Ok(NativeTransaction::new(tx))
        })
    }

    /// Run one statement outside a transaction; returns rows affected.
    #[pyo3(signature = (sql, params))]
    fn execute<'py>(
        &self,
        py: Python<'py>,
        sql: String,
        params: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = params
            .iter()
            .map(Param::extract)
            .collect::<PyResult<Vec<_>>>()?;
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let mut q = sqlx::query(&sql);
            for p in params {
                q = p.bind(q);
            }
            let done = q.execute(&pool).await.map_err(AwaError::from).py_err()?;
            Ok(done.rows_affected())
        })
    }

    /// Start a worker for the Python kinds given; returns a `NativeWorker`.
    fn start<'py>(
        &self,
        py: Python<'py>,
        config_json: String,
        kinds: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let cfg: StartConfig = serde_json::from_str(&config_json)
            .map_err(|e| AwaError::Config(e.to_string()))
            .py_err()?;
        let rc = runtime_config(&cfg).py_err()?;
        let (bridge, rx) = crate::worker::bridge();
        let mut builder = awa_core::Client::builder(self.pool.clone()).config(rc);
        if cfg.queues.is_empty() {
            return Err(crate::errors::to_py(AwaError::Config(
                "start() needs at least one queue".into(),
            )));
        }
        for q in &cfg.queues {
            builder = builder.queue(q.name.clone(), queue_config(q).py_err()?);
        }
        for kind in kinds {
            builder = builder.register_erased(kind, bridge.clone());
        }
        let client = builder.build().py_err()?;
        bridge::spawn(py, async move {
            client.start().await.py_err()?;
            Ok(crate::worker::NativeWorker {
                client,
                rx: Arc::new(tokio::sync::Mutex::new(rx)),
                closed: Arc::new(tokio::sync::Notify::new()),
                is_closed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            })
        })
    }

    fn cancel<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { admin::cancel(&pool, job_id).await })
    }

    /// Cancel the unfinished job holding the key the request (JSON) would have.
    fn cancel_by_unique_key<'py>(
        &self,
        py: Python<'py>,
        request: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let job = parse_requests(std::slice::from_ref(&request))?.pop();
        let key = job.and_then(|j| j.unique_key).ok_or_else(|| {
            crate::errors::ValidationError::new_err("cancel_by_unique_key needs unique_opts")
        })?;
        let pool = self.pool.clone();
        json_future(
            py,
            async move { admin::cancel_by_unique_key(&pool, &key).await },
        )
    }

    fn retry<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { admin::retry(&pool, job_id).await })
    }

    fn set_queue_paused<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        paused: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move {
            admin::set_queue_paused(&pool, &queue, paused).await
        })
    }

    fn drain_queue<'py>(&self, py: Python<'py>, queue: String) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { admin::drain_queue(&pool, &queue).await })
    }

    fn queue_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { admin::queue_stats(&pool).await })
    }

    #[pyo3(signature = (kind = None, queue = None))]
    fn retry_failed<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move {
            admin::retry_failed(&pool, kind.as_deref(), queue.as_deref()).await
        })
    }

    #[pyo3(signature = (kind = None, queue = None))]
    fn discard_failed<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move {
            admin::discard_failed(&pool, kind.as_deref(), queue.as_deref()).await
        })
    }

    #[pyo3(signature = (queue = None, limit = 100))]
    fn list_dlq<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move {
            dlq::list_dlq(&pool, queue.as_deref(), limit).await
        })
    }

    fn get_dlq_job<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { dlq::get_dlq_job(&pool, job_id).await })
    }

    #[pyo3(signature = (queue = None))]
    fn dlq_depth<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(
            py,
            async move { dlq::dlq_depth(&pool, queue.as_deref()).await },
        )
    }

    fn retry_from_dlq<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(py, async move { dlq::retry_from_dlq(&pool, job_id).await })
    }

    #[pyo3(signature = (queue = None))]
    fn purge_dlq<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        json_future(
            py,
            async move { dlq::purge_dlq(&pool, queue.as_deref()).await },
        )
    }

    /// Resolve a callback: action is complete, fail, retry, resume or heartbeat.
    #[pyo3(signature = (action, callback_id, payload_json = None, error = None, timeout_seconds = 3600.0))]
    fn callback<'py>(
        &self,
        py: Python<'py>,
        action: String,
        callback_id: String,
        payload_json: Option<String>,
        error: Option<String>,
        timeout_seconds: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let payload = payload_json
            .map(|p| serde_json::from_str::<serde_json::Value>(&p))
            .transpose()
            .map_err(AwaError::from)
            .py_err()?;
        let pool = self.pool.clone();
        json_future(py, async move {
            // Registered specs are Rust-only; from Python, external completion fires none.
            let specs = awa_core::specs::Specs::default();
            match action.as_str() {
                "complete" => {
                    callbacks::complete_external(&pool, &specs, &callback_id, payload).await
                }
                "fail" => {
                    callbacks::fail_external(
                        &pool,
                        &specs,
                        &callback_id,
                        error.as_deref().unwrap_or("failed externally"),
                    )
                    .await
                }
                "retry" => callbacks::retry_external(&pool, &callback_id).await,
                "resume" => callbacks::resume_external(&pool, &callback_id, payload).await,
                "heartbeat" => {
                    let seconds = awa_core::executor::config::check_setting(
                        "timeout_seconds",
                        timeout_seconds,
                    )?;
                    callbacks::heartbeat_callback(
                        &pool,
                        &callback_id,
                        Duration::from_secs_f64(seconds),
                    )
                    .await
                }
                other => Err(AwaError::Config(format!("unknown callback action {other}"))),
            }
        })
    }

    /// Claim one job of `queue` and run it through the real executor and finalizer path
    /// (`awa_core::testing::work_one`); the handler runs in Python via the returned run.
    fn work_one_begin<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        kind: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            let (bridge, mut rx) = crate::worker::bridge();
            let specs = awa_core::specs::Specs::default();
            let mut run = tokio::spawn(async move {
                awa_core::testing::work_one_of_kind(&pool, &queue, Some(&kind), bridge, &specs)
                    .await
            });
            // Either the job reaches the bridge (a handler must run) or work_one ends first.
            let ctx = tokio::select! {
                pending = rx.recv() => pending,
                done = &mut run => {
                    let result = done.map_err(|e| AwaError::State(e.to_string())).and_then(|r| r).py_err()?;
                    return Ok(crate::worker::NativeTestRun::finished(result));
                }
            };
            Ok(crate::worker::NativeTestRun::running(ctx, run))
        })
    }

    /// Engine counters as JSON text.
    fn metrics(&self) -> PyResult<String> {
        let map: std::collections::BTreeMap<&str, u64> =
            awa_core::metrics::snapshot().into_iter().collect();
        serde_json::to_string(&map).map_err(AwaError::from).py_err()
    }

    /// Close the pool and wait for it, blocking this thread (used at interpreter exit, when
    /// no event loop may be left to await on).
    fn close_blocking(&self, py: Python<'_>) {
        let pool = self.pool.clone();
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(pool.close()));
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        bridge::spawn(py, async move {
            pool.close().await;
            Ok(())
        })
    }
}

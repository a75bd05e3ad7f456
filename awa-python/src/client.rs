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
use awa_core::storage::pool::{ConnectTarget, Db};
use awa_core::storage::{admin, batch_ops, callbacks, dlq, routing, transition};
use awa_core::{AwaError, JobFilter, JobRow, JobState, NewJob};
use pyo3::prelude::*;
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

    /// Run the COPY on `conn` (a pooled connection or a caller's transaction), on the engine
    /// new jobs go to (`awa_core::storage::routing`).
    pub(crate) async fn copy(
        conn: &mut sqlx::PgConnection,
        db: &awa_core::Db,
        jobs: &[NewJob],
        returning: bool,
    ) -> Result<Copied, AwaError> {
        Ok(match routing::copy_in(conn, db, jobs, returning).await? {
            routing::Copied::Rows(rows) => Copied::Rows(serde_json::to_string(&rows)?),
            routing::Copied::Count(n) => Copied::Count(n),
        })
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

/// Check one numeric setting (`start()` keywords, `shutdown(timeout_ms)`, callback
/// `timeout_seconds`) against the engine's range; returns it, or raises `ValidationError`
/// naming the field and the range.
/// Every migration as `(version, description, sql)` (awa-pg's `migrations()`).
#[pyfunction]
pub(crate) fn migrations() -> Vec<(i32, String, &'static str)> {
    awa_core::storage::migrations::migrations()
}

/// The migrations after `from_version` up to and including `to_version`.
#[pyfunction]
pub(crate) fn migrations_range(
    from_version: i32,
    to_version: i32,
) -> Vec<(i32, String, &'static str)> {
    awa_core::storage::migrations::migrations_range(from_version, to_version)
}

/// The newest schema version this library knows (awa-pg's `current_migration_version()`).
#[pyfunction]
pub(crate) fn current_migration_version() -> i32 {
    awa_core::storage::migrations::latest_version()
}

#[pyfunction]
pub(crate) fn check_setting(field: &str, value: f64) -> PyResult<f64> {
    awa_core::executor::config::check_setting(field, value).py_err()
}

/// `"queue"` or `"kind"` as the catalogue it names.
fn descriptor_subject(subject: &str) -> PyResult<awa_core::storage::descriptors::Subject> {
    use awa_core::storage::descriptors::Subject;
    match subject {
        "queue" => Ok(Subject::Queue),
        "kind" => Ok(Subject::JobKind),
        other => Err(crate::errors::ValidationError::new_err(format!(
            "descriptor subject must be \"queue\" or \"kind\", not {other:?}"
        ))),
    }
}

/// Check one descriptor declaration (`queue_descriptor`/`job_kind_descriptor`, JSON) the way
/// `start()` will, so a bad one fails where it is declared: `awa.ConfigError` naming the field.
#[pyfunction]
pub(crate) fn check_descriptor(subject: &str, name: &str, descriptor_json: &str) -> PyResult<()> {
    let subject = descriptor_subject(subject)?;
    let d: awa_core::storage::descriptors::Descriptor = serde_json::from_str(descriptor_json)
        .map_err(|e| AwaError::Config(format!("descriptor of {name:?}: {e}")))
        .py_err()?;
    d.validate(subject, name).py_err()
}

/// An RFC 3339 instant sent by the Python package (which turns datetimes into text).
fn parse_instant(text: &str) -> PyResult<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| {
            crate::errors::ValidationError::new_err(format!(
                "{text:?} is not an RFC 3339 timestamp: {e}"
            ))
        })
}

fn dlq_filter(
    kind: Option<String>,
    queue: Option<String>,
    tag: Option<String>,
    before_id: Option<i64>,
    before_dlq_at: Option<String>,
) -> PyResult<dlq::DlqFilter> {
    Ok(dlq::DlqFilter {
        kind,
        queue,
        tag,
        before_id,
        before_dlq_at: before_dlq_at.as_deref().map(parse_instant).transpose()?,
    })
}

/// Parse and check a batch operation's kind, spec and filter (JSON text from the package).
fn batch_request(
    op_kind: &str,
    spec_json: &str,
    filter_json: Option<&str>,
) -> PyResult<batch_ops::BatchRequest> {
    let spec: serde_json::Value = serde_json::from_str(spec_json)
        .map_err(AwaError::from)
        .py_err()?;
    let filter: Option<serde_json::Value> = filter_json
        .map(serde_json::from_str)
        .transpose()
        .map_err(AwaError::from)
        .py_err()?;
    batch_ops::BatchRequest::parse(op_kind, &spec, filter.as_ref()).py_err()
}

#[pyclass(module = "awa._awa")]
pub struct NativeClient {
    pub(crate) pool: Db,
    /// Set once this client has seen that the database's `awa` schema is not a foreign one.
    schema_checked: Arc<tokio::sync::OnceCell<()>>,
}

impl NativeClient {
    /// The foreign-schema check of [`NativeClient::spawn`], as a future of its own (for calls
    /// that run elsewhere, such as the periodic-job functions in `cron.rs`).
    pub(crate) fn schema_check(
        &self,
    ) -> impl std::future::Future<Output = Result<(), AwaError>> + Send + 'static {
        let (pool, checked) = (self.pool.clone(), self.schema_checked.clone());
        async move {
            checked
                .get_or_try_init(|| awa_core::storage::foreign::refuse_foreign(&pool))
                .await
                .map(|_| ())
        }
    }

    /// `bridge::spawn`, after refusing a foreign `awa` schema (awa-pg's, issue 13 item 8) with
    /// `awa.ForeignSchema`. The check is one catalog query, run before this client's first
    /// database call and remembered once it passed; while it fails it runs again on every
    /// call, so each call raises the same clear error instead of a missing-column one.
    fn spawn<'py, F, T>(&self, py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: std::future::Future<Output = PyResult<T>> + Send + 'static,
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let check = self.schema_check();
        bridge::spawn(py, async move {
            check.await.py_err()?;
            fut.await
        })
    }

    /// [`json_future`] behind the same check as [`NativeClient::spawn`].
    fn json_future<'py, F, T>(&self, py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: std::future::Future<Output = Result<T, AwaError>> + Send + 'static,
        T: serde::Serialize + Send + 'static,
    {
        let check = self.schema_check();
        json_future(py, async move {
            check.await?;
            fut.await
        })
    }
}

#[pymethods]
impl NativeClient {
    /// Parse the URL, open one connection to check that the server answers (fail fast, as
    /// awa-pg's constructor does: a `DatabaseError` naming host, port and cause within the
    /// connect timeout), then create the pool, which connects lazily.
    #[new]
    #[pyo3(signature = (database_url, max_connections = 10))]
    fn new(py: Python<'_>, database_url: &str, max_connections: u32) -> PyResult<Self> {
        let target = ConnectTarget::parse(database_url).py_err()?;
        let runtime = pyo3_async_runtimes::tokio::get_runtime();
        let pool = {
            let _guard = runtime.enter();
            target.pool(max_connections)
        };
        let check = pool.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // Spawned and awaited through a channel rather than `block_on`: the constructor may
        // run on one of the runtime's own threads (a handler's callback), where `block_on`
        // is not allowed.
        runtime.spawn(async move {
            let _ = tx.send(check.check().await);
        });
        py.detach(move || rx.recv())
            .map_err(|_| AwaError::State("the connection check ended abnormally".into()))
            .and_then(|r| r)
            .py_err()?;
        Ok(NativeClient {
            pool,
            schema_checked: Arc::default(),
        })
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
        self.spawn(py, async move {
            let rows = routing::insert_jobs(&pool, &jobs).await.py_err()?;
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
        self.spawn(py, async move {
            join(tokio::spawn(async move {
                let jobs = batch.into_jobs()?;
                if jobs.is_empty() {
                    return Copied::empty(returning);
                }
                // In a transaction: all or nothing either way, and through PgBouncer in
                // transaction mode every statement needs one (see awa_core's `Db`).
                let mut tx = pool.begin().await?;
                let copied = Copied::copy(&mut tx, &pool, &jobs, returning).await?;
                tx.commit().await?;
                Ok(copied)
            }))
            .await
        })
    }

    fn get_job<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.spawn(py, async move {
            let job = routing::get_job(&pool, job_id).await.py_err()?;
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
        self.spawn(py, async move {
            let jobs = routing::list_jobs(&pool, &filter).await.py_err()?;
            jobs_json(&jobs)
        })
    }

    /// Open a transaction.
    fn transaction<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.spawn(py, async move {
            let tx = pool.begin().await.map_err(AwaError::from).py_err()?;
            Ok(NativeTransaction::new(tx, pool))
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
        self.spawn(py, async move {
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
        let cfg = crate::start_config::parse(&config_json).py_err()?;
        let rc = crate::start_config::runtime_config(&cfg).py_err()?;
        let (bridge, rx) = crate::worker::bridge();
        let mut builder = awa_core::Client::builder(self.pool.clone()).config(rc);
        if cfg.queues.is_empty() {
            return Err(crate::errors::to_py(AwaError::Config(
                "start() needs at least one queue".into(),
            )));
        }
        for q in &cfg.queues {
            builder = builder.queue(
                q.name.clone(),
                crate::start_config::queue_config(q).py_err()?,
            );
        }
        for kind in kinds {
            builder = builder.register_erased(kind, bridge.clone());
        }
        for (queue, d) in &cfg.queue_descriptors {
            builder = builder.queue_descriptor(queue.clone(), d.clone());
        }
        for (kind, d) in &cfg.job_kind_descriptors {
            builder = builder.job_kind_descriptor(kind.clone(), d.clone());
        }
        let client = builder.build().py_err()?;
        self.spawn(py, async move {
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
        self.json_future(py, async move { routing::cancel(&pool, job_id).await })
    }

    /// Install queue storage and route every new job to it (awa-pg's
    /// `install_queue_storage`); `awa_core::storage::transition::install_queue_storage`.
    #[pyo3(signature = (schema, queue_slot_count, lease_slot_count, reset))]
    fn install_queue_storage<'py>(
        &self,
        py: Python<'py>,
        schema: String,
        queue_slot_count: i64,
        lease_slot_count: i64,
        reset: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let qs = queue_storage_config(&schema, queue_slot_count, lease_slot_count)?;
        let pool = self.pool.clone();
        self.spawn(py, async move {
            transition::install_queue_storage(&pool, &qs, reset)
                .await
                .py_err()
        })
    }

    /// Install the queue-storage substrate without routing to it (the first step of a live
    /// transition; awa-pg's `prepare_queue_storage_schema`).
    #[pyo3(signature = (schema, queue_slot_count, lease_slot_count))]
    fn prepare_queue_storage_schema<'py>(
        &self,
        py: Python<'py>,
        schema: String,
        queue_slot_count: i64,
        lease_slot_count: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let qs = queue_storage_config(&schema, queue_slot_count, lease_slot_count)?;
        let pool = self.pool.clone();
        self.spawn(py, async move {
            transition::prepare_queue_storage_schema(&pool, &qs)
                .await
                .py_err()
        })
    }

    /// The storage status as a JSON object (text).
    fn storage_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.spawn(py, async move {
            let status = transition::status(&pool).await.py_err()?;
            Ok(status.to_string())
        })
    }

    /// One transition step (`prepare`, `enter_mixed_transition`, `finalize`, `abort`); the
    /// state after it as a JSON object (text).
    #[pyo3(signature = (action, schema = None))]
    fn storage_transition<'py>(
        &self,
        py: Python<'py>,
        action: String,
        schema: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.spawn(py, async move {
            let state = transition::step(&pool, &action, schema.as_deref())
                .await
                .py_err()?;
            Ok(state.to_string())
        })
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
        self.json_future(py, async move {
            routing::cancel_by_unique_key(&pool, &key).await
        })
    }

    /// Cancel the unfinished job holding the key built from exactly these parts (awa-pg's
    /// `cancel_by_unique_key(kind, *, queue, args, period_bucket)`; docs/unique-keys.md).
    #[pyo3(signature = (kind, queue = None, args_json = None, period_bucket = None))]
    fn cancel_by_unique_parts<'py>(
        &self,
        py: Python<'py>,
        kind: String,
        queue: Option<String>,
        args_json: Option<String>,
        period_bucket: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = args_json
            .map(|text| serde_json::from_str::<serde_json::Value>(&text))
            .transpose()
            .map_err(AwaError::from)
            .py_err()?;
        let key = awa_core::model::unique_key::compute(awa_core::model::unique_key::KeyParts {
            kind: &kind,
            queue: queue.as_deref(),
            args: args.as_ref(),
            period_bucket,
        });
        let pool = self.pool.clone();
        self.json_future(py, async move {
            routing::cancel_by_unique_key(&pool, &key).await
        })
    }

    /// The queue (`subject="queue"`) or job-kind (`"kind"`) descriptor catalogue, as JSON
    /// (docs/operating.md, "Descriptors").
    fn list_descriptors<'py>(&self, py: Python<'py>, subject: &str) -> PyResult<Bound<'py, PyAny>> {
        let subject = descriptor_subject(subject)?;
        let pool = self.pool.clone();
        self.json_future(py, async move {
            awa_core::storage::descriptors::list(&pool, subject).await
        })
    }

    /// Every client registered in the runtime registry, as JSON (docs/runtime-registry.md).
    fn list_runtime_instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            awa_core::storage::runtime_instances::list(&pool).await
        })
    }

    fn retry<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { routing::retry(&pool, job_id).await })
    }

    fn set_queue_paused<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        paused: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            admin::set_queue_paused(&pool, &queue, paused).await
        })
    }

    #[pyo3(signature = (queue, paused_by = None))]
    fn pause_queue<'py>(
        &self,
        py: Python<'py>,
        queue: String,
        paused_by: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            admin::pause_queue(&pool, &queue, paused_by.as_deref()).await
        })
    }

    fn drain_queue<'py>(&self, py: Python<'py>, queue: String) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { routing::drain_queue(&pool, &queue).await })
    }

    fn queue_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { routing::queue_stats(&pool).await })
    }

    /// `{"jobs": [...], "matched": n}` as JSON.
    #[pyo3(signature = (kind = None, queue = None, allow_all = false))]
    fn retry_failed<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
        allow_all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            routing::retry_failed(&pool, kind.as_deref(), queue.as_deref(), allow_all).await
        })
    }

    #[pyo3(signature = (kind, queue = None))]
    fn discard_failed<'py>(
        &self,
        py: Python<'py>,
        kind: String,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            routing::discard_failed(&pool, &kind, queue.as_deref()).await
        })
    }

    /// Dead-lettered jobs matching the filter, newest first, as JSON.
    #[pyo3(signature = (kind = None, queue = None, tag = None, before_id = None, before_dlq_at = None, limit = 100))]
    #[allow(clippy::too_many_arguments)]
    fn list_dlq<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
        tag: Option<String>,
        before_id: Option<i64>,
        before_dlq_at: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let filter = dlq_filter(kind, queue, tag, before_id, before_dlq_at)?;
        let pool = self.pool.clone();
        self.json_future(
            py,
            async move { dlq::list_dlq(&pool, &filter, limit).await },
        )
    }

    /// One dead-lettered job as JSON (`null` when absent).
    fn get_dlq_job<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { dlq::get_dlq_job(&pool, job_id).await })
    }

    #[pyo3(signature = (queue = None))]
    fn dlq_depth<'py>(
        &self,
        py: Python<'py>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(
            py,
            async move { dlq::dlq_depth(&pool, queue.as_deref()).await },
        )
    }

    fn dlq_depth_by_queue<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { dlq::dlq_depth_by_queue(&pool).await })
    }

    /// Revive a dead-lettered job with overrides; the job as JSON (`null` when absent).
    #[pyo3(signature = (job_id, run_at = None, priority = None, queue = None))]
    fn retry_from_dlq<'py>(
        &self,
        py: Python<'py>,
        job_id: i64,
        run_at: Option<String>,
        priority: Option<i64>,
        queue: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let priority = priority
            .map(|p| {
                i16::try_from(p).map_err(|_| {
                    AwaError::from(awa_core::model::ValidationError::Priority { value: p })
                })
            })
            .transpose()
            .py_err()?;
        let overrides = dlq::RetryOverrides {
            run_at: run_at.as_deref().map(parse_instant).transpose()?,
            priority,
            queue,
        };
        let pool = self.pool.clone();
        self.json_future(py, async move {
            dlq::retry_from_dlq(&pool, job_id, &overrides).await
        })
    }

    #[pyo3(signature = (kind = None, queue = None, tag = None, allow_all = false))]
    fn bulk_retry_from_dlq<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
        tag: Option<String>,
        allow_all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let filter = dlq_filter(kind, queue, tag, None, None)?;
        let pool = self.pool.clone();
        self.json_future(py, async move {
            dlq::bulk_retry_from_dlq(&pool, &filter, allow_all).await
        })
    }

    /// Move one failed job to the DLQ; the entry as JSON (`null` when no failed job has the id).
    fn move_failed_to_dlq<'py>(
        &self,
        py: Python<'py>,
        job_id: i64,
        reason: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move {
            dlq::move_failed_to_dlq(&pool, job_id, &reason).await
        })
    }

    #[pyo3(signature = (kind = None, queue = None, reason = "manual", allow_all = false))]
    fn bulk_move_failed_to_dlq<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
        reason: &str,
        allow_all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reason = reason.to_string();
        let pool = self.pool.clone();
        self.json_future(py, async move {
            dlq::bulk_move_failed_to_dlq(
                &pool,
                kind.as_deref(),
                queue.as_deref(),
                &reason,
                allow_all,
            )
            .await
        })
    }

    fn purge_dlq_job<'py>(&self, py: Python<'py>, job_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.clone();
        self.json_future(py, async move { dlq::purge_dlq_job(&pool, job_id).await })
    }

    #[pyo3(signature = (kind = None, queue = None, tag = None, before_id = None, before_dlq_at = None, allow_all = false))]
    #[allow(clippy::too_many_arguments)]
    fn purge_dlq<'py>(
        &self,
        py: Python<'py>,
        kind: Option<String>,
        queue: Option<String>,
        tag: Option<String>,
        before_id: Option<i64>,
        before_dlq_at: Option<String>,
        allow_all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let filter = dlq_filter(kind, queue, tag, before_id, before_dlq_at)?;
        let pool = self.pool.clone();
        self.json_future(py, async move {
            dlq::purge_dlq(&pool, &filter, allow_all).await
        })
    }

    // ----- durable batch operations (docs/batch-operations.md) ------------------------------
    //
    // Spec and filter cross as JSON text (the Python package turns datetimes into RFC 3339
    // text); results return as JSON text.

    /// `{"total_matched": n, "sample": [job, ...]}` as JSON.
    #[pyo3(signature = (op_kind, spec_json, filter_json = None))]
    fn preview_batch_operation<'py>(
        &self,
        py: Python<'py>,
        op_kind: &str,
        spec_json: &str,
        filter_json: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = batch_request(op_kind, spec_json, filter_json)?;
        let pool = self.pool.clone();
        self.json_future(py, async move { batch_ops::preview(&pool, &request).await })
    }

    /// The new operation's row as JSON.
    #[pyo3(signature = (op_kind, spec_json, filter_json = None, submitted_by = None, allow_all = false))]
    fn submit_batch_operation<'py>(
        &self,
        py: Python<'py>,
        op_kind: &str,
        spec_json: &str,
        filter_json: Option<&str>,
        submitted_by: Option<String>,
        allow_all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = batch_request(op_kind, spec_json, filter_json)?;
        let pool = self.pool.clone();
        self.json_future(py, async move {
            batch_ops::submit(&pool, &request, submitted_by.as_deref(), allow_all).await
        })
    }

    #[pyo3(signature = (state = None, limit = 100))]
    fn list_batch_operations<'py>(
        &self,
        py: Python<'py>,
        state: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(s) = &state {
            batch_ops::parse_op_state(s).py_err()?;
        }
        let pool = self.pool.clone();
        self.json_future(py, async move {
            batch_ops::list(&pool, state.as_deref(), limit).await
        })
    }

    fn get_batch_operation<'py>(
        &self,
        py: Python<'py>,
        operation_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        batch_ops::parse_op_id(&operation_id).py_err()?;
        let pool = self.pool.clone();
        self.json_future(
            py,
            async move { batch_ops::get(&pool, &operation_id).await },
        )
    }

    fn cancel_batch_operation<'py>(
        &self,
        py: Python<'py>,
        operation_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        batch_ops::parse_op_id(&operation_id).py_err()?;
        let pool = self.pool.clone();
        self.json_future(
            py,
            async move { batch_ops::cancel(&pool, &operation_id).await },
        )
    }

    /// How many finished operations were deleted, as JSON.
    #[pyo3(signature = (before, limit = 1000))]
    fn purge_batch_operations<'py>(
        &self,
        py: Python<'py>,
        before: &str,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let before = parse_instant(before)?;
        let pool = self.pool.clone();
        self.json_future(
            py,
            async move { batch_ops::purge(&pool, before, limit).await },
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
        self.json_future(py, async move {
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

    /// Resolve a callback with its CEL rules (`storage::callbacks::resolve_callback`);
    /// resolves to the resolution as JSON text. `default_action` None means "ignore".
    #[pyo3(signature = (callback_id, payload_json = None, default_action = None))]
    fn resolve_callback<'py>(
        &self,
        py: Python<'py>,
        callback_id: String,
        payload_json: Option<String>,
        default_action: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let payload = payload_json
            .map(|p| serde_json::from_str::<serde_json::Value>(&p))
            .transpose()
            .map_err(AwaError::from)
            .py_err()?;
        let default: awa_core::model::DefaultAction = default_action
            .as_deref()
            .unwrap_or("ignore")
            .parse()
            .py_err()?;
        let pool = self.pool.clone();
        self.json_future(py, async move {
            let specs = awa_core::specs::Specs::default();
            callbacks::resolve_callback(&pool, &specs, &callback_id, payload, default).await
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
        self.spawn(py, async move {
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

/// A queue-storage handle from Python's arguments, refused with awa-pg's messages.
fn queue_storage_config(
    schema: &str,
    queue_slots: i64,
    lease_slots: i64,
) -> PyResult<awa_core::storage::queue_storage::QueueStorage> {
    let clamp = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    transition::queue_storage(schema, clamp(queue_slots), clamp(lease_slots)).py_err()
}

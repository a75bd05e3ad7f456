//! `Client`: registration, start and shutdown of the worker runtime, plus the admin calls that
//! need registered specs (external completion).

use crate::error::{AwaError, Result};
use crate::executor::config::{QueueConfig, RuntimeConfig};
use crate::executor::context::{JobContext, StateMap};
use crate::executor::result::HandlerResult;
use crate::executor::runtime::{self, Running};
use crate::executor::{ClosureHandler, ErasedHandler, Worker, WorkerHandler};
use crate::model::{EnqueueRequest, JobArgs, JobRow};
use crate::specs::{SpecEvent, Specs};
use crate::storage::descriptors::{self, Catalogue, Descriptor, Subject};
use crate::storage::engine::Engine;
use crate::storage::pool::Db;
use crate::storage::{admin, callbacks};
use std::any::TypeId;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Longest `start()` waits for its first runtime-registry write.
const REGISTRY_FIRST_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The ADR-029 builder pairs: `on_<event>_enqueue(|args| request)` and
/// `on_<event>_enqueue_with(|args, job| Option<request>)` (`None` skips).
macro_rules! spec_builders {
    ($( #[doc = $when:literal] $plain:ident, $with:ident => $event:expr; )*) => {$(
        #[doc = concat!("On `A`", $when, ", enqueue the request built from its args (same transaction).")]
        pub fn $plain<A: JobArgs, B: JobArgs, F>(self, f: F) -> Self
        where
            F: Fn(&A) -> EnqueueRequest<B> + Send + Sync + 'static,
        {
            self.$with::<A, B, _>(move |a, _| Some(f(a)))
        }

        #[doc = concat!("On `A`", $when, ", enqueue what the closure returns; `None` skips.")]
        pub fn $with<A: JobArgs, B: JobArgs, F>(mut self, f: F) -> Self
        where
            F: Fn(&A, &JobRow) -> Option<EnqueueRequest<B>> + Send + Sync + 'static,
        {
            self.specs.add::<A, B, F>($event, f);
            self
        }
    )*};
}

/// Builds a [`Client`].
pub struct ClientBuilder {
    pool: Db,
    url: Option<String>,
    config: RuntimeConfig,
    queues: HashMap<String, QueueConfig>,
    handlers: HashMap<String, Arc<dyn ErasedHandler>>,
    specs: Specs,
    state: StateMap,
    periodic: Vec<crate::cron::PeriodicJob>,
    descriptors: Catalogue,
}

impl ClientBuilder {
    /// Work `name` with this configuration.
    pub fn queue(mut self, name: impl Into<String>, config: QueueConfig) -> Self {
        self.queues.insert(name.into(), config);
        self
    }

    /// Replace the runtime configuration (intervals, retention, batch sizes).
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// The database URL for the maintenance leader's dedicated connection (defaults to the
    /// pool's connect options).
    pub fn database_url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Register a closure handler for `A`'s kind. The closure gets the args and the context
    /// and returns a `'static` future (take `ctx.follow_ups()` to stage from inside it).
    pub fn register<A, F, Fut>(mut self, f: F) -> Self
    where
        A: JobArgs,
        F: Fn(A, &JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.handlers
            .insert(A::kind(), Arc::new(ClosureHandler::<A, F>::new(f)));
        self
    }

    /// Register a [`Worker`].
    pub fn register_worker<W: Worker>(mut self, worker: W) -> Self {
        let kind = worker.kind();
        self.handlers
            .insert(kind, Arc::new(WorkerHandler(Arc::new(worker))));
        self
    }

    /// Register a type-erased handler for `kind` (how the Python bindings plug in).
    pub fn register_erased(
        mut self,
        kind: impl Into<String>,
        handler: Arc<dyn ErasedHandler>,
    ) -> Self {
        self.handlers.insert(kind.into(), handler);
        self
    }

    /// Application state handlers read with `ctx.extract::<T>()`.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state = self.state.with(Arc::new(value), TypeId::of::<T>());
        self
    }

    spec_builders! {
        /// completing
        on_completed_enqueue, on_completed_enqueue_with => SpecEvent::Completed;
        /// failing for good (terminal error, exhausted attempts or a poisoned attempt)
        on_exhausted_enqueue, on_exhausted_enqueue_with => SpecEvent::Exhausted;
        /// going to be retried (retryable error, panic or RetryAfter)
        on_retried_enqueue, on_retried_enqueue_with => SpecEvent::Retried;
        /// being cancelled by its handler
        on_cancelled_enqueue, on_cancelled_enqueue_with => SpecEvent::Cancelled;
    }

    // ----- periodic jobs (docs/periodic.md) -----

    /// Register a periodic job. Its expression, zone and job options are checked by
    /// [`ClientBuilder::build`]; the schedule is upserted into `awa.cron_jobs` by
    /// [`Client::start`] (a changed definition updates the row) and fired by whichever
    /// client is the maintenance leader. A second registration of a name replaces the first.
    pub fn periodic(mut self, job: crate::cron::PeriodicJob) -> Self {
        self.periodic.retain(|p| p.name != job.name);
        self.periodic.push(job);
        self
    }

    // ----- descriptors (docs/operating.md, "Descriptors") -----

    /// Describe a queue for the web UI and API (awa-pg's `queue_descriptor`). The queue must
    /// be one this client works ([`ClientBuilder::build`] refuses another); a second
    /// declaration replaces the first. Written by [`Client::start`] and refreshed with the
    /// runtime registry.
    pub fn queue_descriptor(mut self, queue: impl Into<String>, descriptor: Descriptor) -> Self {
        self.descriptors
            .queues
            .insert(queue.into(), Some(descriptor));
        self
    }

    /// Describe a job kind (awa-pg's `job_kind_descriptor`); any kind, handled here or not.
    pub fn job_kind_descriptor(mut self, kind: impl Into<String>, descriptor: Descriptor) -> Self {
        self.descriptors.kinds.insert(kind.into(), Some(descriptor));
        self
    }

    /// The declared descriptors checked, plus a bare entry for every other queue worked and
    /// kind handled, so the catalogue lists everything a live client serves.
    fn catalogue(&self) -> Result<Catalogue> {
        let mut catalogue = Catalogue::default();
        for (queue, d) in &self.descriptors.queues {
            if !self.queues.contains_key(queue) {
                return Err(AwaError::Config(format!(
                    "queue descriptor declared for unknown queue {queue:?}: describe only \
                     queues this client works"
                )));
            }
            if let Some(d) = d {
                d.validate(Subject::Queue, queue)?;
            }
        }
        for (kind, d) in &self.descriptors.kinds {
            if let Some(d) = d {
                d.validate(Subject::JobKind, kind)?;
            }
        }
        for queue in self.queues.keys() {
            let declared = self.descriptors.queues.get(queue).cloned().flatten();
            catalogue.queues.insert(queue.clone(), declared);
        }
        catalogue.kinds = self.descriptors.kinds.clone();
        for kind in self.handlers.keys() {
            catalogue.kinds.entry(kind.clone()).or_insert(None);
        }
        Ok(catalogue)
    }

    fn check_periodic(&self) -> Result<()> {
        self.periodic
            .iter()
            .try_for_each(|p| p.validate().map(|_| ()))
    }

    /// Build the client; refuses settings out of range (`AwaError::Config` naming the field
    /// and the limit) rather than letting a timer panic later.
    pub fn build(self) -> Result<Client> {
        self.check_periodic()?;
        self.config.validate()?;
        for (name, queue) in &self.queues {
            queue.validate(name)?;
        }
        crate::executor::pool::overflow_pool(self.config.global_max_workers, &self.queues)?;
        let descriptors = Arc::new(self.catalogue()?);
        Ok(Client {
            inner: Arc::new(Inner {
                pool: self.pool,
                url: self.url,
                config: self.config,
                queues: self.queues,
                handlers: self.handlers,
                specs: self.specs,
                state: self.state,
                periodic: self.periodic,
                descriptors,
                running: Mutex::new(None),
            }),
        })
    }
}

struct Inner {
    pool: Db,
    url: Option<String>,
    config: RuntimeConfig,
    queues: HashMap<String, QueueConfig>,
    handlers: HashMap<String, Arc<dyn ErasedHandler>>,
    specs: Specs,
    state: StateMap,
    periodic: Vec<crate::cron::PeriodicJob>,
    descriptors: Arc<Catalogue>,
    running: Mutex<Option<Running>>,
}

/// A worker client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// A builder over `pool`: a [`Db`] (from [`crate::storage::pool::ConnectTarget::pool`]) or
    /// a plain `PgPool` (used in session mode).
    pub fn builder(pool: impl Into<Db>) -> ClientBuilder {
        ClientBuilder {
            pool: pool.into(),
            url: None,
            config: RuntimeConfig::default(),
            queues: HashMap::new(),
            handlers: HashMap::new(),
            specs: Specs::default(),
            state: StateMap::default(),
            periodic: Vec::new(),
            descriptors: Catalogue::default(),
        }
    }

    pub fn pool(&self) -> &Db {
        &self.inner.pool
    }

    /// The follow-up specs registered on this client's builder.
    ///
    /// `testing::work_one` and `finalizer::finalize_with_retry` take a `&Specs`, but `Specs`
    /// can only be filled through the builder's `on_*_enqueue*` methods, so without this
    /// accessor code outside the crate could only ever pass `Specs::default()` and the
    /// harness could not run registered specs.
    pub fn specs(&self) -> &Specs {
        &self.inner.specs
    }

    /// Start claiming and running jobs on every configured queue.
    pub async fn start(&self) -> Result<()> {
        let mut running = self.inner.running.lock().await;
        if running.is_some() {
            return Err(AwaError::State("the client is already started".into()));
        }
        if self.inner.queues.is_empty() {
            return Err(AwaError::Config("no queues configured".into()));
        }
        crate::storage::foreign::refuse_foreign(&self.inner.pool).await?;
        // The engine this runtime works, decided once from its role and the transition state
        // (`storage::transition`), unless the pool handle names one.
        let pool = match self.inner.pool.engine() {
            Engine::QueueStorage(_) => self.inner.pool.clone(),
            Engine::Canonical => {
                let config = &self.inner.config;
                let engine = crate::storage::transition::runtime_engine(
                    &self.inner.pool,
                    config.transition_role,
                    config.queue_storage_schema.as_deref(),
                    config.queue_storage_slots,
                )
                .await?;
                self.inner.pool.with_engine(engine)
            }
        };
        if let Engine::QueueStorage(qs) = pool.engine() {
            // A substrate an older library installed gets this library's functions (and the
            // fixes in them) before this runtime calls one; a no-op read when current.
            qs.upgrade_or_explain(&pool).await?;
        }
        crate::cron::upsert(&self.inner.pool, &self.inner.periodic).await?;
        // Written before the runtime starts, so a start that returned has its catalogue rows.
        descriptors::sync(
            &self.inner.pool,
            &self.inner.descriptors,
            self.inner.config.heartbeat_interval,
        )
        .await?;
        for (name, qc) in &self.inner.queues {
            if qc.dlq {
                admin::set_queue_dlq(&self.inner.pool, name, true).await?;
            }
        }
        *running = Some(runtime::start(
            pool,
            self.inner.config.clone(),
            self.inner.queues.clone(),
            self.inner.handlers.clone(),
            self.inner.specs.clone(),
            self.inner.state.clone(),
            self.inner.url.clone(),
            self.inner.descriptors.clone(),
        )?);
        if let Some(r) = running.as_ref() {
            // The registry row is there when start() returns (awa-pg's is too, and operators
            // look right after a deploy), unless its first write failed or is slow: the
            // registry is observability, never a reason to fail or stall start().
            let wait = r.shared.instance.first_write.notified();
            let _ = tokio::time::timeout(REGISTRY_FIRST_WRITE_WAIT, wait).await;
        }
        tracing::info!(queues = self.inner.queues.len(), "worker started");
        Ok(())
    }

    /// Stop claiming, let running handlers finish and finalize within `timeout`, then abandon
    /// the rest (rescue re-runs them). Idempotent.
    pub async fn shutdown(&self, timeout: Duration) {
        let running = self.inner.running.lock().await.take();
        if let Some(r) = running {
            runtime::shutdown(r, timeout).await;
        }
    }

    /// Whether the runtime is running.
    pub async fn is_running(&self) -> bool {
        self.inner.running.lock().await.is_some()
    }

    /// Whether this client currently holds the maintenance leadership.
    pub async fn is_leader(&self) -> bool {
        match self.inner.running.lock().await.as_ref() {
            Some(r) => r.shared.is_leader.load(Ordering::SeqCst),
            None => false,
        }
    }

    /// This client's id in the runtime registry (`awa.runtime_instances`), once its row is
    /// written after [`Client::start`]; `None` before that and after shutdown.
    pub async fn instance_id(&self) -> Option<String> {
        let running = self.inner.running.lock().await;
        running
            .as_ref()
            .and_then(|r| r.shared.instance.id.get().cloned())
    }

    /// Every client registered in the database (not only this one): the runtime registry,
    /// docs/runtime-registry.md.
    pub async fn runtime_instances(
        &self,
    ) -> Result<Vec<crate::storage::runtime_instances::RuntimeInstance>> {
        crate::storage::runtime_instances::list(&self.inner.pool).await
    }

    /// Attempts this client holds: claimed (including jobs claimed ahead that wait for a
    /// slot), running or finalizing.
    pub async fn in_flight(&self) -> usize {
        match self.inner.running.lock().await.as_ref() {
            Some(r) => r.shared.inflight.len(),
            None => 0,
        }
    }

    /// The database answers and the runtime's state.
    pub async fn health_check(&self) -> Result<Health> {
        sqlx::query("SELECT 1").execute(&self.inner.pool).await?;
        let version = crate::storage::migrations::current_version(&self.inner.pool).await?;
        Ok(Health {
            database: true,
            schema_version: version,
            running: self.is_running().await,
            leader: self.is_leader().await,
            in_flight: self.in_flight().await,
            instance_id: self.instance_id().await,
        })
    }

    /// Complete the job waiting on `callback_id` (registered Completed specs fire).
    pub async fn complete_external(
        &self,
        callback_id: &str,
        payload: Option<serde_json::Value>,
    ) -> Result<JobRow> {
        callbacks::complete_external(&self.inner.pool, &self.inner.specs, callback_id, payload)
            .await
    }

    pub async fn fail_external(&self, callback_id: &str, error: &str) -> Result<JobRow> {
        callbacks::fail_external(&self.inner.pool, &self.inner.specs, callback_id, error).await
    }

    pub async fn retry_external(&self, callback_id: &str) -> Result<JobRow> {
        callbacks::retry_external(&self.inner.pool, callback_id).await
    }

    pub async fn resume_external(
        &self,
        callback_id: &str,
        payload: Option<serde_json::Value>,
    ) -> Result<JobRow> {
        callbacks::resume_external(&self.inner.pool, callback_id, payload).await
    }

    pub async fn heartbeat_callback(&self, callback_id: &str, timeout: Duration) -> Result<JobRow> {
        callbacks::heartbeat_callback(&self.inner.pool, callback_id, timeout).await
    }

    /// Cancel a job (signals it when running).
    pub async fn cancel(&self, job_id: i64) -> Result<JobRow> {
        crate::storage::routing::cancel(&self.inner.pool, job_id).await
    }

    // ----- periodic jobs (docs/periodic.md) -----

    /// Every schedule in the database (not only this client's registrations).
    pub async fn list_cron_jobs(&self) -> Result<Vec<crate::cron::CronJobRow>> {
        crate::cron::list(&self.inner.pool).await
    }

    /// Delete a schedule; `false` when there was none.
    pub async fn delete_cron_job(&self, name: &str) -> Result<bool> {
        crate::cron::delete(&self.inner.pool, name).await
    }

    /// Stop a schedule's automatic fires; `false` when there is none.
    pub async fn pause_cron_job(&self, name: &str) -> Result<bool> {
        crate::cron::set_paused(&self.inner.pool, name, true).await
    }

    /// Resume a paused schedule (missed fires follow its policy); `false` when there is none.
    pub async fn resume_cron_job(&self, name: &str) -> Result<bool> {
        crate::cron::set_paused(&self.inner.pool, name, false).await
    }

    /// Enqueue a schedule's job now; `None` when there is no such schedule.
    pub async fn trigger_cron_job(&self, name: &str) -> Result<Option<JobRow>> {
        crate::cron::trigger(&self.inner.pool, name).await
    }
}

/// What `health_check` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Health {
    pub database: bool,
    pub schema_version: i32,
    pub running: bool,
    pub leader: bool,
    pub in_flight: usize,
    /// This client's row in `awa.runtime_instances` (docs/runtime-registry.md), once written.
    pub instance_id: Option<String>,
}

//! Awa: a Postgres-native background job queue.
//!
//! # Layout
//! - [`model`]: job rows and states, insert and unique options, kind derivation, the shared
//!   validator every insert path uses.
//! - [`storage`]: migrations and the SQL for inserts (and the bulk COPY path), claims,
//!   callbacks, the DLQ and admin actions, generic over any executor where a caller's
//!   transaction makes sense; `storage::pool`: the one connect path (`ConnectTarget`: TLS,
//!   connect timeout, PgBouncer's transaction mode), `Db`, the pool handle every path uses;
//!   `storage::engine`: which storage engine (canonical `awa.jobs`, or the append-only
//!   `storage::queue_storage`) the runtime's statements go to, carried by the `Db`;
//!   [`pool_options`], the recommended pool settings, and [`close_pool`], which really
//!   closes one.
//! - [`executor`]: dispatchers, runners, the handler context, heartbeats, shutdown.
//! - [`finalizer`]: lease-guarded outcomes on the batched and per-job paths, with retries.
//! - [`follow_ups`]: the staging buffer handlers use to enqueue follow-ups on completion (ADR-046).
//! - [`specs`]: registered follow-up specs (ADR-029).
//! - [`maintenance`]: leader election, promotion, rescue, retention.
//! - [`cron`]: periodic jobs: schedules, the leader's exactly-once evaluation, operations.
//! - [`client`]: building, starting and stopping a worker client.
//! - [`testing`]: `work_one`, the harness that runs one job through the real executor path.
//! - [`seams`]: fault-injection points (feature `test-seams`); [`metrics`]: counters, and
//!   per-kind/queue job counters and timing histograms (`metrics::series`); `telemetry`
//!   (feature `otlp`): their OpenTelemetry export over OTLP/gRPC.
//! - [`error`]: [`AwaError`], the one error type the bindings map to exceptions.
//! - [`callback_contract`]: signing and checking callback ids (`X-Awa-Signature`) and building
//!   receiver URLs, in awa-pg's format.

pub mod callback_contract;
pub mod client;
pub mod cron;
pub mod error;
pub mod executor;
pub mod finalizer;
pub mod follow_ups;
pub mod maintenance;
pub mod metrics;
pub mod model;
pub mod seams;
pub mod specs;
pub mod storage;
#[cfg(feature = "otlp")]
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{Client, ClientBuilder, Health};
pub use error::{AwaError, Result};
pub use executor::config::{QueueConfig, RuntimeConfig};
pub use executor::context::{CallbackToken, JobContext};
pub use executor::result::{HandlerResult, JobError, JobResult, Outcome};
pub use executor::{ErasedHandler, Worker};
pub use follow_ups::{FollowUps, StageError};
pub use model::{
    derive_kind, states_mask, EnqueueRequest, InsertOpts, JobArgs, JobRow, JobState, NewJob,
    UniqueOpts, ValidationError,
};
pub use storage::admin::{get_job, list_jobs, JobFilter};
pub use storage::copy::{insert_many_copy, insert_many_copy_returning};
pub use storage::insert::{insert, insert_jobs, insert_many, insert_untyped, insert_with};
pub use storage::migrations::migrate;
pub use storage::pool::{close_pool, pool_options, ConnectTarget, Db, PoolMode};

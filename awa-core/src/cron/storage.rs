//! Schedules in `awa.cron_jobs` (migration 5): the definition a client registers, and the
//! operations a CLI or web UI needs (list, delete, pause, resume, trigger now).

use super::schedule::{Schedule, ScheduleError};
use crate::error::{AwaError, Result};
use crate::model::validate::{validate, NewJob, MAX_NAME_CHARS};
use crate::model::{InsertOpts, JobArgs, JobRow};
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;

/// Metadata key naming the schedule that enqueued a job.
pub const META_NAME: &str = "awa:cron_name";
/// Metadata key with the fire time (RFC 3339, UTC) a job was enqueued for.
pub const META_FIRE_AT: &str = "awa:cron_fire_at";
/// Metadata key set to `true` on a job enqueued by [`trigger`] rather than by the schedule.
pub const META_TRIGGERED: &str = "awa:cron_triggered";

/// What the leader does with fires it evaluates late (the leader was down, paused or slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedFirePolicy {
    /// Missed fires collapse into one job, for the latest of them.
    #[default]
    Coalesce,
    /// Every missed fire gets a job, in order, at most
    /// [`super::evaluate::CATCH_UP_LIMIT`] per schedule and evaluation.
    CatchUp,
}

impl MissedFirePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MissedFirePolicy::Coalesce => "coalesce",
            MissedFirePolicy::CatchUp => "catch_up",
        }
    }

    pub fn parse(s: &str) -> Result<MissedFirePolicy> {
        match s {
            "coalesce" => Ok(MissedFirePolicy::Coalesce),
            "catch_up" => Ok(MissedFirePolicy::CatchUp),
            other => Err(AwaError::Config(format!(
                "missed_fire_policy is {other:?}; it must be \"coalesce\" or \"catch_up\""
            ))),
        }
    }
}

/// A periodic job as registered on a client: a named schedule plus the job it enqueues.
#[derive(Debug, Clone)]
pub struct PeriodicJob {
    pub name: String,
    pub cron_expr: String,
    /// An IANA zone name; the expression is read in its wall-clock time.
    pub timezone: String,
    pub kind: String,
    pub args: serde_json::Value,
    /// Queue, priority, max_attempts, tags and metadata of each fired job (`run_at` and
    /// `unique` are not used: fires are enqueued available, deduplicated by the schedule).
    pub opts: InsertOpts,
    pub missed_fire_policy: MissedFirePolicy,
}

impl PeriodicJob {
    /// A schedule `name` firing `cron_expr` (UTC) that enqueues `args` with default options.
    pub fn new<A: JobArgs>(
        name: impl Into<String>,
        cron_expr: impl Into<String>,
        args: &A,
    ) -> Result<PeriodicJob> {
        Ok(PeriodicJob::untyped(
            name,
            cron_expr,
            A::kind(),
            serde_json::to_value(args)?,
        ))
    }

    /// The same with a kind and JSON args (how the Python bindings register).
    pub fn untyped(
        name: impl Into<String>,
        cron_expr: impl Into<String>,
        kind: impl Into<String>,
        args: serde_json::Value,
    ) -> PeriodicJob {
        PeriodicJob {
            name: name.into(),
            cron_expr: cron_expr.into(),
            timezone: "UTC".into(),
            kind: kind.into(),
            args,
            opts: InsertOpts::default(),
            missed_fire_policy: MissedFirePolicy::default(),
        }
    }

    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        self.timezone = timezone.into();
        self
    }

    pub fn opts(mut self, opts: InsertOpts) -> Self {
        self.opts = opts;
        self
    }

    pub fn missed_fire_policy(mut self, policy: MissedFirePolicy) -> Self {
        self.missed_fire_policy = policy;
        self
    }

    /// Check everything a fire would need: the name, the expression, the zone and the job
    /// (by the insert validator). Errors name the schedule and the bad part.
    pub fn validate(&self) -> Result<Schedule> {
        let context =
            |msg: String| AwaError::Config(format!("periodic job {:?}: {msg}", self.name));
        if self.name.is_empty() || self.name.chars().count() > MAX_NAME_CHARS {
            return Err(AwaError::Config(format!(
                "periodic job name {:?} must have 1 to {MAX_NAME_CHARS} characters",
                self.name
            )));
        }
        if self.name.contains('\0') {
            return Err(AwaError::Config(
                "periodic job name contains a NUL byte".into(),
            ));
        }
        let schedule =
            Schedule::parse(&self.cron_expr, &self.timezone).map_err(|e| context(e.to_string()))?;
        self.job_template().map_err(|e| context(e.to_string()))?;
        Ok(schedule)
    }

    /// The job every fire inserts, before the fire's metadata is added.
    fn job_template(&self) -> std::result::Result<NewJob, crate::model::ValidationError> {
        let mut opts = self.opts.clone();
        opts.run_at = None;
        opts.unique = None;
        validate(&self.kind, self.args.clone(), &opts)
    }
}

/// One row of `awa.cron_jobs`, as `list` returns it.
#[derive(Debug, Clone, Serialize)]
pub struct CronJobRow {
    pub name: String,
    pub cron_expr: String,
    pub timezone: String,
    pub kind: String,
    pub queue: String,
    pub args: serde_json::Value,
    pub priority: i16,
    pub max_attempts: i32,
    pub tags: Vec<String>,
    pub metadata: serde_json::Value,
    pub missed_fire_policy: String,
    pub paused: bool,
    /// The newest fire time handled (enqueued, or collapsed by `coalesce`).
    pub last_enqueued_at: Option<DateTime<Utc>>,
    /// The next fire the leader will enqueue (`None` until it has evaluated the row).
    pub next_fire_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub(crate) const ROW_COLUMNS: &str = "name, cron_expr, timezone, kind, queue, args, priority, \
    max_attempts, tags, metadata, missed_fire_policy, paused, last_enqueued_at, next_fire_at, \
    created_at, updated_at";

impl CronJobRow {
    pub(crate) fn from_row(r: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        Ok(CronJobRow {
            name: r.try_get("name")?,
            cron_expr: r.try_get("cron_expr")?,
            timezone: r.try_get("timezone")?,
            kind: r.try_get("kind")?,
            queue: r.try_get("queue")?,
            args: r.try_get("args")?,
            priority: r.try_get("priority")?,
            max_attempts: r.try_get("max_attempts")?,
            tags: r.try_get("tags")?,
            metadata: r.try_get("metadata")?,
            missed_fire_policy: r.try_get("missed_fire_policy")?,
            paused: r.try_get("paused")?,
            last_enqueued_at: r.try_get("last_enqueued_at")?,
            next_fire_at: r.try_get("next_fire_at")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        })
    }

    /// The schedule of this row (rows written by hand may not parse).
    pub(crate) fn schedule(&self) -> std::result::Result<Schedule, ScheduleError> {
        Schedule::parse(&self.cron_expr, &self.timezone)
    }

    /// The job a fire at `fire_at` inserts: the row's job plus the fire's metadata.
    pub(crate) fn job_for(&self, fire_at: DateTime<Utc>, triggered: bool) -> Result<NewJob> {
        let mut metadata = match &self.metadata {
            serde_json::Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        metadata.insert(META_NAME.into(), self.name.clone().into());
        metadata.insert(META_FIRE_AT.into(), fire_at.to_rfc3339().into());
        if triggered {
            metadata.insert(META_TRIGGERED.into(), true.into());
        }
        let opts = InsertOpts {
            queue: self.queue.clone(),
            priority: self.priority,
            max_attempts: self.max_attempts,
            tags: self.tags.clone(),
            metadata: metadata.into(),
            ..InsertOpts::default()
        };
        Ok(validate(&self.kind, self.args.clone(), &opts)?)
    }
}

/// Insert or update the registered schedules. An unchanged definition leaves its row alone
/// (so a restart, or a second client registering the same schedule, changes nothing); a
/// changed one is updated and re-evaluated on the leader's next pass, keeping
/// `last_enqueued_at` (no fire at or before it is enqueued again) and `paused`.
pub async fn upsert(pool: &Db, jobs: &[PeriodicJob]) -> Result<()> {
    for job in jobs {
        job.validate()?;
        let template = job.job_template()?;
        sqlx::query(
            "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args, priority,
                 max_attempts, tags, metadata, missed_fire_policy)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (name) DO UPDATE SET
                 cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone,
                 kind = EXCLUDED.kind, queue = EXCLUDED.queue, args = EXCLUDED.args,
                 priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
                 tags = EXCLUDED.tags, metadata = EXCLUDED.metadata,
                 missed_fire_policy = EXCLUDED.missed_fire_policy,
                 next_fire_at = NULL, updated_at = clock_timestamp()
             WHERE (awa.cron_jobs.cron_expr, awa.cron_jobs.timezone, awa.cron_jobs.kind,
                    awa.cron_jobs.queue, awa.cron_jobs.args, awa.cron_jobs.priority,
                    awa.cron_jobs.max_attempts, awa.cron_jobs.tags, awa.cron_jobs.metadata,
                    awa.cron_jobs.missed_fire_policy)
                   IS DISTINCT FROM
                   (EXCLUDED.cron_expr, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.queue,
                    EXCLUDED.args, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.tags,
                    EXCLUDED.metadata, EXCLUDED.missed_fire_policy)",
        )
        .bind(&job.name)
        .bind(&job.cron_expr)
        .bind(&job.timezone)
        .bind(&template.kind)
        .bind(&template.queue)
        .bind(&template.args)
        .bind(template.priority)
        .bind(template.max_attempts)
        .bind(&template.tags)
        .bind(&template.metadata)
        .bind(job.missed_fire_policy.as_str())
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Every schedule, by name.
pub async fn list(pool: &Db) -> Result<Vec<CronJobRow>> {
    let rows = sqlx::query(&format!(
        "SELECT {ROW_COLUMNS} FROM awa.cron_jobs ORDER BY name"
    ))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(CronJobRow::from_row)
        .collect::<std::result::Result<_, _>>()?)
}

/// One schedule, or `None`.
pub async fn get(pool: &Db, name: &str) -> Result<Option<CronJobRow>> {
    let row = sqlx::query(&format!(
        "SELECT {ROW_COLUMNS} FROM awa.cron_jobs WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(CronJobRow::from_row).transpose()?)
}

/// Delete a schedule; `false` when there was none. Jobs it already enqueued stay. A client
/// that still registers it recreates it at its next start.
pub async fn delete(pool: &Db, name: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM awa.cron_jobs WHERE name = $1")
        .bind(name)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Pause (`true`) or resume (`false`) a schedule; `false` when there is none. While paused
/// the leader enqueues nothing for it; on resume the fires missed meanwhile are handled by
/// its missed-fire policy. A restart does not change `paused`.
pub async fn set_paused(pool: &Db, name: &str, paused: bool) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE awa.cron_jobs SET paused = $2, next_fire_at = NULL, updated_at = clock_timestamp()
         WHERE name = $1",
    )
    .bind(name)
    .bind(paused)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Enqueue one job for a schedule now, paused or not; `None` when there is no such schedule.
/// The job's metadata has the schedule name, now as its fire time and
/// `"awa:cron_triggered": true`; the schedule's own fires are not affected.
pub async fn trigger(pool: &Db, name: &str) -> Result<Option<JobRow>> {
    let Some(row) = get(pool, name).await? else {
        return Ok(None);
    };
    let job = row.job_for(Utc::now(), true)?;
    let mut rows = crate::storage::routing::insert_jobs(pool, std::slice::from_ref(&job)).await?;
    Ok(rows.pop())
}

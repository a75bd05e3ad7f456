//! Queue storage, the second engine (issue 18, `docs/queue-storage-design.md`): the
//! append-only substrate and its hot path.
//!
//! This module installs the tables (`install.sql`) and the functions (`functions.sql`,
//! versioned by [`SUBSTRATE_VERSION`] and replaced when an older library installed them) and
//! drives the hot path: insert due jobs, claim through a lane's cursor and stable point,
//! complete behind the lease guard with narrow receipts, rescue, promote, and rotate both
//! rings, reclaiming the oldest queue slot with carry-forward and `TRUNCATE`. The runtime
//! reaches it through `storage::engine::Engine`. Its tests
//! (`awa-core/tests/queue_storage_test.rs`) hold it to the properties the rotation model
//! (`correctness/storage/AwaQueueRotation.tla`) checks.

use crate::error::{AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::{JobRow, JobState, NewJob};
use crate::specs::{SpecEvent, Specs};
use crate::storage::copy;
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Connection, PgConnection};
use std::collections::BTreeSet;
use std::time::Duration;

const INSTALL_SQL: &str = include_str!("install.sql");
/// The functions working on those tables (and the trigger calling one): run after
/// `INSTALL_SQL` by a fresh install, and on their own by an upgrade.
const FUNCTIONS_SQL: &str = include_str!("functions.sql");
/// The version of `functions.sql`, kept in `{schema}.qs_substrate`. Raise it with every change
/// to that file: an install or a runtime start that finds an older version (or none: every
/// substrate installed before the table existed is version 1) replaces every function, so a
/// fix there reaches databases installed before it without `reset=True`. One that finds a
/// newer version (a newer library's) leaves it alone.
pub const SUBSTRATE_VERSION: i32 = 7;
/// Operator actions and the test harness's claim, and external callbacks' resolution:
/// replaced at every install call (so a substrate installed before one of them existed gets
/// it).
const REPLACED_SQL: [&str; 2] = [include_str!("admin.sql"), include_str!("callbacks.sql")];

/// Slot counts a ring may have (awa-pg's defaults, 16 and 8, are inside).
const SLOT_RANGE: std::ops::RangeInclusive<u32> = 2..=256;

/// Where a queue-storage substrate lives and how big its rings are.
#[derive(Debug, Clone)]
pub struct QueueStorage {
    schema: String,
    queue_slots: u32,
    lease_slots: u32,
}

/// A lane's claim position (for tests and status reads).
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub queue: String,
    pub priority: i16,
    pub cursor: i64,
    pub stable_seq: i64,
}

/// How one attempt ends on the per-job path (the batched path is [`QueueStorage::complete`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    Completed,
    /// Failed for good; `error` is appended to the job's errors.
    Failed {
        error: Value,
    },
    Cancelled {
        error: Value,
    },
    /// Run again at `run_at`, the attempt burned; `error`, when given, is appended.
    Retryable {
        run_at: DateTime<Utc>,
        error: Option<Value>,
    },
    /// Run again at `run_at` without burning the attempt.
    Snoozed {
        run_at: DateTime<Utc>,
    },
}

impl Finish {
    fn parts(&self) -> (&'static str, Option<DateTime<Utc>>, Option<&Value>) {
        match self {
            Finish::Completed => ("completed", None, None),
            Finish::Failed { error } => ("failed", None, Some(error)),
            Finish::Cancelled { error } => ("cancelled", None, Some(error)),
            Finish::Retryable { run_at, error } => ("retryable", Some(*run_at), error.as_ref()),
            Finish::Snoozed { run_at } => ("snoozed", Some(*run_at), None),
        }
    }
}

/// What one maintenance pass of the rings did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rotation {
    /// Entries carried forward out of the reclaimed queue slot, when one was reclaimed.
    pub carried: Option<i64>,
    /// The new current queue slot, when the ring moved.
    pub queue_slot: Option<i32>,
    /// The current lease slot after the pass.
    pub lease_slot: i32,
}

impl QueueStorage {
    /// A substrate in `schema` with the given ring sizes. The schema must be a plain lower-case
    /// identifier (it is spliced into SQL); each ring has 2 to 256 slots.
    pub fn new(schema: &str, queue_slots: u32, lease_slots: u32) -> Result<Self> {
        let plain = !schema.is_empty()
            && schema.len() <= 48
            && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain {
            return Err(AwaError::Config(format!(
                "queue storage schema {schema:?} must be a lower-case identifier of at most 48 \
                 characters (letters, digits, underscores; not starting with a digit)"
            )));
        }
        for (name, n) in [
            ("queue_slot_count", queue_slots),
            ("lease_slot_count", lease_slots),
        ] {
            if !SLOT_RANGE.contains(&n) {
                return Err(AwaError::Config(format!(
                    "{name} is {n}; it must be between {} and {}",
                    SLOT_RANGE.start(),
                    SLOT_RANGE.end()
                )));
            }
        }
        Ok(QueueStorage {
            schema: schema.to_string(),
            queue_slots,
            lease_slots,
        })
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    fn name(&self, object: &str) -> String {
        format!("{}.{object}", self.schema)
    }

    /// The substrate's tables (their children and the view go with them), read from the
    /// install script itself so that removing them cannot miss one added later.
    pub(crate) fn tables() -> Vec<&'static str> {
        let mut tables = Self::created("CREATE TABLE {s}.");
        tables.extend(Self::created("CREATE TABLE IF NOT EXISTS {s}."));
        tables
    }

    /// The substrate's functions, read from the install scripts as [`QueueStorage::tables`].
    pub(crate) fn functions() -> Vec<&'static str> {
        Self::created("CREATE FUNCTION {s}.")
    }

    /// The substrate's types (the claim's row), read from the install scripts likewise.
    pub(crate) fn types() -> Vec<&'static str> {
        Self::created("CREATE TYPE {s}.")
    }

    /// What an upgrade drops and creates again: the functions of `functions.sql` (the
    /// `REPLACED_SQL` scripts replace theirs in place).
    fn versioned_functions() -> Vec<&'static str> {
        Self::created_in(&[FUNCTIONS_SQL], "CREATE FUNCTION {s}.")
    }

    fn created(prefix: &str) -> Vec<&'static str> {
        let mut scripts = vec![INSTALL_SQL, FUNCTIONS_SQL];
        scripts.extend(REPLACED_SQL);
        Self::created_in(&scripts, prefix)
    }

    fn created_in(scripts: &[&'static str], prefix: &str) -> Vec<&'static str> {
        let replaced = prefix.replacen("CREATE ", "CREATE OR REPLACE ", 1);
        scripts
            .iter()
            .flat_map(|script| script.lines())
            .filter_map(move |line| {
                line.strip_prefix(prefix)
                    .or_else(|| line.strip_prefix(replaced.as_str()))
            })
            .filter_map(|rest| rest.split([' ', '(']).next())
            .filter(|name| !name.is_empty())
            .collect()
    }

    /// Whether the substrate is installed in this schema.
    pub async fn installed(&self, pool: &Db) -> Result<bool> {
        Ok(self.installed_version(pool).await?.is_some())
    }

    /// Install the substrate (tables, children of both rings, functions) in one transaction.
    /// Needs the canonical schema (`migrate()`): job ids come from `awa.jobs_id_seq`, one
    /// sequence for both engines. Installing where it is already installed does nothing.
    /// Making it the engine new jobs go to is `storage::transition`'s work.
    pub async fn install(&self, pool: &Db) -> Result<()> {
        let mut tx = pool.begin().await?;
        self.install_in(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`QueueStorage::install`] on the caller's open transaction.
    pub async fn install_in(&self, conn: &mut PgConnection) -> Result<()> {
        match self.version_on(conn).await? {
            None => {
                let sql = INSTALL_SQL
                    .replace("{s}", &self.schema)
                    .replace("{q}", &self.queue_slots.to_string())
                    .replace("{l}", &self.lease_slots.to_string());
                // The simple-query protocol runs the whole script (raw_sql's future is not
                // `Send` for every lifetime, which a spawned caller needs).
                sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
                self.write_functions(conn, false).await?;
            }
            // A newer library's: left alone, its `REPLACED_SQL` too (those read what its
            // functions write; since version 4, that an entry below its lane's cursor is
            // consumed, which an older script would not know).
            Some(v) if v > SUBSTRATE_VERSION => {}
            Some(_) => {
                if !self.upgrade_in(conn).await? {
                    // Current functions: the scripts replaced at every install still run.
                    self.write_replaced(conn).await?;
                }
            }
        }
        Ok(())
    }

    /// Run the `REPLACED_SQL` scripts (`CREATE OR REPLACE`).
    async fn write_replaced(&self, conn: &mut PgConnection) -> Result<()> {
        for script in REPLACED_SQL {
            let sql = script.replace("{s}", &self.schema);
            sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
        }
        Ok(())
    }

    /// The version of the installed functions ([`SUBSTRATE_VERSION`]): 1 for a substrate
    /// installed before versions were kept, `None` where none is installed. Read through the
    /// statement's snapshot, not the catalog cache (which a wait on the upgrade's lock does
    /// not refresh).
    pub async fn installed_version(&self, pool: &Db) -> Result<Option<i32>> {
        // In a transaction of `Db`'s (behind PgBouncer in transaction mode, statements run
        // only inside one).
        let mut tx = pool.begin().await?;
        let version = self.version_on(&mut tx).await?;
        tx.rollback().await?;
        Ok(version)
    }

    async fn version_on(&self, conn: &mut PgConnection) -> Result<Option<i32>> {
        let (ring, kept): (bool, bool) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                            WHERE n.nspname = $1 AND c.relname = 'queue_ring_state'),
                    EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                            WHERE n.nspname = $1 AND c.relname = 'qs_substrate')",
        )
        .bind(&self.schema)
        .fetch_one(&mut *conn)
        .await?;
        if !ring {
            return Ok(None);
        }
        if !kept {
            return Ok(Some(1));
        }
        let sql = format!("SELECT version FROM {}", self.name("qs_substrate"));
        let version: Option<i32> = sqlx::query_scalar(&sql).fetch_optional(&mut *conn).await?;
        Ok(Some(version.unwrap_or(1)))
    }

    /// [`QueueStorage::upgrade`], with a refusal for lack of rights (a role that may not
    /// drop or create functions in the schema) explained as what the schema owner must do.
    pub async fn upgrade_or_explain(&self, pool: &Db) -> Result<bool> {
        let e = match self.upgrade(pool).await {
            Err(AwaError::Database(e)) => e,
            other => return other,
        };
        let Some(cause) = crate::storage::migrations::denied(&e) else {
            return Err(AwaError::Database(e));
        };
        let found = self.installed_version(pool).await?.unwrap_or(0);
        Err(AwaError::State(format!(
            "queue storage's functions in schema \"{schema}\" are version {found} but this \
             library's are version {SUBSTRATE_VERSION}, and this database role may not replace \
             them ({cause}); the schema owner must run migrate() or install_queue_storage() \
             first, see docs/deploying.md",
            schema = self.schema,
        )))
    }

    /// Replace the substrate's functions when they are older than this library's
    /// ([`SUBSTRATE_VERSION`]), in one transaction; the tables and every row in them are
    /// untouched. Returns whether it replaced them. A no-op (one read) when they are current
    /// or newer, or when no substrate is installed here. Concurrent callers take turns, and
    /// the later ones find the work done. What runs meanwhile keeps working: the functions'
    /// signatures stay callable by older runtimes, and a call in flight finishes with the
    /// version it started with.
    pub async fn upgrade(&self, pool: &Db) -> Result<bool> {
        let mut tx = pool.begin().await?;
        let upgraded = self.upgrade_in(&mut tx).await?;
        tx.commit().await?;
        Ok(upgraded)
    }

    async fn upgrade_in(&self, conn: &mut PgConnection) -> Result<bool> {
        match self.version_on(conn).await? {
            Some(v) if v < SUBSTRATE_VERSION => {}
            _ => return Ok(false),
        }
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('awa.qs_substrate'), hashtext($1))")
            .bind(&self.schema)
            .execute(&mut *conn)
            .await?;
        match self.version_on(conn).await? {
            Some(v) if v < SUBSTRATE_VERSION => {}
            _ => return Ok(false),
        }
        self.write_functions(conn, true).await?;
        tracing::info!(
            schema = %self.schema,
            version = SUBSTRATE_VERSION,
            "queue storage functions upgraded"
        );
        Ok(true)
    }

    /// Run `functions.sql` (after dropping every function it names, whatever the arguments,
    /// when `replace`) and the `REPLACED_SQL` scripts, and record the version.
    async fn write_functions(&self, conn: &mut PgConnection, replace: bool) -> Result<()> {
        let mut sql = String::new();
        if replace {
            sql.push_str(&drop_functions_sql(&self.schema, false));
        }
        // The lease ring's size as installed (a runtime's configured count may differ).
        let ring = format!("SELECT slots FROM {}", self.name("lease_ring_state"));
        let lease_slots: i32 = sqlx::query_scalar(&ring).fetch_one(&mut *conn).await?;
        sql.push_str(&render_functions(&self.schema, lease_slots)?);
        sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
        self.write_replaced(conn).await?;
        let record = format!(
            "INSERT INTO {} (version) VALUES ($1)
             ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            self.name("qs_substrate")
        );
        sqlx::query(&record)
            .bind(SUBSTRATE_VERSION)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Insert validated jobs (what every insert path builds with the shared validator): a job
    /// due now becomes a ready entry in the current slot, a later one a scheduled deferred
    /// row. Returns the ids in input order. Runs in `executor`'s transaction when it is one.
    pub async fn enqueue<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        let refs: Vec<&NewJob> = jobs.iter().collect();
        self.enqueue_refs(executor, &refs).await
    }

    /// [`QueueStorage::enqueue`] of borrowed jobs (follow-ups are borrowed from their
    /// sealed buffers, which a retry of the completion needs again).
    pub async fn enqueue_refs<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        jobs: &[&NewJob],
    ) -> Result<Vec<i64>> {
        Ok(self.enqueue_stamped(executor, jobs).await?.0)
    }

    /// [`QueueStorage::enqueue_refs`], also returning the statement's `now()`: the
    /// `created_at` (and, for a job without `run_at`, the `run_at`) the jobs were stored with,
    /// so a caller can return the new rows without a second round trip.
    pub(crate) async fn enqueue_stamped<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        jobs: &[&NewJob],
    ) -> Result<(Vec<i64>, DateTime<Utc>)> {
        let rows = self.enqueue_with(executor, jobs, true, false).await?;
        let now = rows.first().map_or_else(Utc::now, |(_, at)| *at);
        // Without skipping, every job is inserted or the call fails: each id is there.
        Ok((rows.into_iter().filter_map(|(id, _)| id).collect(), now))
    }

    /// Insert follow-ups inside a completion's transaction: as [`QueueStorage::enqueue_refs`]
    /// but without the NOTIFY (a notifying commit serializes with every other one; the
    /// completion wakes their queues after it commits), and a follow-up whose unique key a
    /// live job holds is skipped (`None`), as canonical skips it.
    pub(crate) async fn enqueue_follow_ups<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        jobs: &[&NewJob],
    ) -> Result<Vec<Option<i64>>> {
        let rows = self.enqueue_with(executor, jobs, false, true).await?;
        Ok(rows.into_iter().map(|(id, _)| id).collect())
    }

    async fn enqueue_with<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        jobs: &[&NewJob],
        notify: bool,
        skip_held: bool,
    ) -> Result<Vec<(Option<i64>, DateTime<Utc>)>> {
        let sql = format!(
            "SELECT q.id, now() FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 AS q(id)",
            self.name("qs_enqueue")
        );
        let result = sqlx::query_as(&sql)
            .bind(jobs.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| &j.args).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
            // text[] per job cannot be a two-dimensional array of varying lengths: jsonb.
            .bind(
                jobs.iter()
                    .map(|j| Value::from(j.tags.clone()))
                    .collect::<Vec<_>>(),
            )
            .bind(jobs.iter().map(|j| &j.metadata).collect::<Vec<_>>())
            .bind(
                jobs.iter()
                    .map(|j| j.unique_key.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                jobs.iter()
                    .map(|j| j.unique_states.map(i16::from))
                    .collect::<Vec<_>>(),
            )
            .bind(
                jobs.iter()
                    .map(|j| j.ordering_key.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(notify)
            .bind(skip_held)
            .fetch_all(executor)
            .await;
        match result {
            Ok(ids) => Ok(ids),
            // The same class and message as canonical's insert (`storage::insert`).
            Err(e) if crate::error::is_unique_conflict(&e) => Err(AwaError::UniqueConflict {
                kind: crate::storage::insert::kinds_summary(jobs),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// [`QueueStorage::enqueue`] by `COPY ... FROM STDIN` (binary) into the current slot for the
    /// jobs due now (jobs due later take the row path into `deferred_jobs`); returns how many
    /// were written. All or nothing: it runs in a transaction of its own, or in a savepoint of
    /// the caller's. The statement-level trigger holds the producer's transaction id before the
    /// rows draw their seqs, as for row inserts.
    pub async fn enqueue_copy(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<u64> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let mut tx = conn.begin().await?;
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        // A batch with unique keys takes the row path whole: it takes their keys, and the
        // jobs keep their order.
        let keyed = jobs.iter().any(|j| j.unique_key.is_some());
        let (due, later): (Vec<&NewJob>, Vec<&NewJob>) = jobs
            .iter()
            .partition(|j| !keyed && j.run_at.is_none_or(|at| at <= now));
        let mut written = 0u64;
        if !later.is_empty() {
            written += self.enqueue_refs(&mut *tx, &later).await?.len() as u64;
        }
        if !due.is_empty() {
            let (slot, generation): (i32, i64) = sqlx::query_as(&format!(
                "SELECT slot, generation FROM {}()",
                self.name("qs_current_slot")
            ))
            .fetch_one(&mut *tx)
            .await?;
            let statement = format!(
                "COPY {} (slot, generation, queue, priority, kind, args, attempt, max_attempts, \
                 run_lease, run_at, created_at, metadata, tags, errors, unique_key, \
                 unique_states, ordering_key) FROM STDIN (FORMAT binary)",
                self.name("ready_entries")
            );
            let stamp = copy::pg_timestamp(now)?;
            let result = copy::stream(&mut tx, &statement, due.iter(), |buf, job| {
                buf.extend_from_slice(&17i16.to_be_bytes());
                copy::put_bytes(buf, &slot.to_be_bytes())?;
                copy::put_bytes(buf, &generation.to_be_bytes())?;
                copy::put_bytes(buf, job.queue.as_bytes())?;
                copy::put_bytes(buf, &job.priority.to_be_bytes())?;
                copy::put_bytes(buf, job.kind.as_bytes())?;
                copy::put_jsonb(buf, &job.args)?;
                copy::put_bytes(buf, &0i32.to_be_bytes())?;
                copy::put_bytes(buf, &job.max_attempts.to_be_bytes())?;
                copy::put_bytes(buf, &0i64.to_be_bytes())?;
                let run_at = job.run_at.map_or(Ok(stamp), copy::pg_timestamp)?;
                copy::put_bytes(buf, &run_at.to_be_bytes())?;
                copy::put_bytes(buf, &stamp.to_be_bytes())?;
                copy::put_jsonb(buf, &job.metadata)?;
                copy::put_text_array(buf, &job.tags)?;
                copy::put_jsonb(buf, &Value::Array(Vec::new()))?;
                match &job.unique_key {
                    Some(key) => copy::put_bytes(buf, key)?,
                    None => copy::put_null(buf),
                }
                match job.unique_states {
                    Some(states) => copy::put_bytes(buf, &i16::from(states).to_be_bytes())?,
                    None => copy::put_null(buf),
                }
                match &job.ordering_key {
                    Some(key) => copy::put_bytes(buf, key.as_bytes())?,
                    None => copy::put_null(buf),
                }
                Ok(())
            })
            .await;
            written += result.map_err(AwaError::from)?;
            let queues: BTreeSet<&str> = due.iter().map(|j| j.queue.as_str()).collect();
            crate::storage::wake_queues(
                &mut *tx,
                &queues.into_iter().map(String::from).collect::<Vec<_>>(),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(written)
    }

    /// Claim up to `n` jobs of lane `(queue, priority)` in seq order.
    pub async fn claim(
        &self,
        pool: &Db,
        queue: &str,
        priority: i16,
        n: i32,
    ) -> Result<Vec<JobRow>> {
        let sql = format!("SELECT * FROM {}($1, $2, $3)", self.name("qs_claim"));
        let rows = sqlx::query(&sql)
            .bind(queue)
            .bind(priority)
            .bind(n)
            .fetch_all(pool)
            .await?;
        Ok(rows
            .iter()
            .map(JobRow::from_row)
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Claim up to `n` jobs of `queue`, best priority first (each of the four lanes in turn);
    /// nothing while the queue is paused (`awa.queue_meta`, shared with canonical). Each
    /// attempt's deadline is `deadline` from now when given (rescue ends it after that).
    pub async fn claim_queue(
        &self,
        pool: &Db,
        queue: &str,
        n: i32,
        deadline: Option<Duration>,
    ) -> Result<Vec<JobRow>> {
        self.claim_queue_aged(pool, queue, n, deadline, None).await
    }

    /// [`QueueStorage::claim_queue`] with priority aging: the lanes are visited in the order
    /// of their oldest waiting entry's priority, one better (down to 1) for every `aging` it
    /// has been due, as canonical orders jobs. Per lane, not per job: the entries behind a
    /// lane's head go with it.
    pub async fn claim_queue_aged(
        &self,
        pool: &Db,
        queue: &str,
        n: i32,
        deadline: Option<Duration>,
        aging: Option<Duration>,
    ) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT * FROM {}($1, $2, make_interval(secs => $3), make_interval(secs => $4))",
            self.name("qs_claim_queue")
        );
        let rows = sqlx::query(&sql)
            .bind(queue)
            .bind(n)
            .bind(deadline.map(|d| d.as_secs_f64()))
            .bind(aging.map(|d| d.as_secs_f64()))
            .fetch_all(pool)
            .await?;
        Ok(rows
            .iter()
            .map(JobRow::from_row)
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Heartbeat attempts `(ids[i], run_leases[i])`; returns the ids still open.
    pub async fn heartbeat(&self, pool: &Db, ids: &[i64], run_leases: &[i64]) -> Result<Vec<i64>> {
        let beats = self.heartbeat_with(pool, ids, run_leases, None).await?;
        Ok(beats.into_iter().map(|(id, _)| id).collect())
    }

    /// [`QueueStorage::heartbeat`] storing each attempt's buffered progress (`None` keeps what
    /// is stored); returns each open attempt with whether a cancel was requested for it.
    pub async fn heartbeat_with(
        &self,
        pool: &Db,
        ids: &[i64],
        run_leases: &[i64],
        progress: Option<&[Option<Value>]>,
    ) -> Result<Vec<(i64, bool)>> {
        let sql = format!("SELECT * FROM {}($1, $2, $3)", self.name("qs_heartbeat"));
        Ok(sqlx::query_as(&sql)
            .bind(ids)
            .bind(run_leases)
            .bind(progress)
            .fetch_all(pool)
            .await?)
    }

    /// Give claimed attempts that never started back (see `qs_release`): each pair still open
    /// with `true` when it was released, `false` when a cancel was requested for it (it stays
    /// running, to be finalized as cancelled).
    pub async fn release(
        &self,
        pool: &Db,
        ids: &[i64],
        run_leases: &[i64],
    ) -> Result<Vec<(i64, bool)>> {
        let sql = format!("SELECT id, what FROM {}($1, $2)", self.name("qs_release"));
        let rows: Vec<(i64, i16)> = sqlx::query_as(&sql)
            .bind(ids)
            .bind(run_leases)
            .fetch_all(pool)
            .await?;
        Ok(rows.into_iter().map(|(id, what)| (id, what == 0)).collect())
    }

    /// Finalize one attempt on the per-job path; false (nothing written) when its lease is gone.
    pub async fn finalize(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        finish: &Finish,
    ) -> Result<bool> {
        self.finalize_in(pool, id, run_lease, finish, None).await
    }

    /// [`QueueStorage::finalize`] through any executor (the runtime's per-job transaction,
    /// which inserts the outcome's follow-ups with it), storing `progress` (the handler's
    /// last, given with the outcome) with a job that is not completed; `None` keeps the
    /// attempt's last heartbeated progress, as canonical's finalizer does.
    pub async fn finalize_in<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        id: i64,
        run_lease: i64,
        finish: &Finish,
        progress: Option<&Value>,
    ) -> Result<bool> {
        let (outcome, run_at, error) = finish.parts();
        let sql = format!(
            "SELECT {}($1, $2, $3, $4, $5, $6)",
            self.name("qs_finalize")
        );
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(outcome)
            .bind(run_at)
            .bind(error)
            .bind(progress)
            .fetch_one(executor)
            .await?)
    }

    /// Record an open attempt's progress; false when its lease is gone.
    pub async fn set_progress(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        progress: &Value,
    ) -> Result<bool> {
        let sql = format!("SELECT {}($1, $2, $3)", self.name("qs_set_progress"));
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(progress)
            .fetch_one(pool)
            .await?)
    }

    /// Register a callback for an open attempt, timing out after `timeout`; its id, or `None`
    /// when the attempt's lease is gone.
    pub async fn register_callback(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        timeout: Duration,
    ) -> Result<Option<String>> {
        self.register_callback_with(pool, id, run_lease, timeout, None)
            .await
    }

    /// [`QueueStorage::register_callback`] with CEL rules (checked by the caller), stored
    /// with the new callback id.
    pub(crate) async fn register_callback_with(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        timeout: Duration,
        rules: Option<&Value>,
    ) -> Result<Option<String>> {
        let sql = format!(
            "SELECT {}($1, $2, make_interval(secs => $3), $4)",
            self.name("qs_register_callback_with")
        );
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(timeout.as_secs_f64())
            .bind(rules)
            .fetch_one(pool)
            .await?)
    }

    /// The job waiting on callback `cid` and its CEL rules, locked for its resolution;
    /// `None` when no attempt waits on it.
    pub(crate) async fn callback_rules(
        &self,
        conn: &mut PgConnection,
        cid: &str,
    ) -> Result<Option<(i64, Option<Value>)>> {
        let sql = format!("SELECT * FROM {}($1::uuid)", self.name("qs_callback_rules"));
        Ok(sqlx::query_as(&sql)
            .bind(cid)
            .fetch_optional(&mut *conn)
            .await?)
    }

    /// Resolve callback `cid` (`qs_resolve_callback`: complete, fail, retry, resume or
    /// heartbeat); the job's id and the queue to wake, or `None` when no attempt waits on it.
    pub(crate) async fn resolve_callback(
        &self,
        conn: &mut PgConnection,
        cid: &str,
        action: &str,
        payload: Option<&Value>,
        error: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<Option<(i64, Option<String>)>> {
        let sql = format!(
            "SELECT * FROM {}($1::uuid, $2, $3, $4, make_interval(secs => $5))",
            self.name("qs_resolve_callback")
        );
        Ok(sqlx::query_as(&sql)
            .bind(cid)
            .bind(action)
            .bind(payload)
            .bind(error)
            .bind(timeout.map(|t| t.as_secs_f64()))
            .fetch_optional(&mut *conn)
            .await?)
    }

    /// Take the payload delivered to attempt `(id, run_lease)` waiting in-process on callback
    /// `cid`; `None` when none is there.
    pub(crate) async fn take_callback_result(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        cid: &str,
    ) -> Result<Option<Value>> {
        let sql = format!(
            "SELECT payload FROM {}($1, $2, $3)",
            self.name("qs_take_callback_result")
        );
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(cid)
            .fetch_optional(pool)
            .await?)
    }

    /// What an in-handler wait of attempt `(id, run_lease)` on `cid` sees of its lease:
    /// (parked, its callback id, timed out, a payload for `cid` waiting); `None` when the
    /// lease is gone.
    pub(crate) async fn callback_wait_state(
        &self,
        pool: &Db,
        id: i64,
        run_lease: i64,
        cid: &str,
    ) -> Result<Option<(bool, Option<String>, bool, bool)>> {
        let sql = format!(
            "SELECT waiting, callback_id::text, coalesce(callback_timeout_at < now(), false),
                    coalesce(callback_result->>'callback_id' = $3, false)
             FROM {} WHERE id = $1 AND run_lease = $2",
            self.name("leases")
        );
        Ok(sqlx::query_as(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(cid)
            .fetch_optional(pool)
            .await?)
    }

    /// Park an attempt on its callback (`waiting_external`), storing the handler's last
    /// `progress` with it (`None` keeps what was heartbeated); false when the lease is gone or
    /// the callback is not this attempt's.
    pub async fn park<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        id: i64,
        run_lease: i64,
        callback_id: &str,
        progress: Option<&Value>,
    ) -> Result<bool> {
        let sql = format!("SELECT {}($1, $2, $3, $4)", self.name("qs_park"));
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .bind(run_lease)
            .bind(callback_id)
            .bind(progress)
            .fetch_one(executor)
            .await?)
    }

    /// Cancel a job as canonical's `cancel` does; the state it is left in (`cancelled`, or
    /// `running` for a running attempt, which is told on `awa:cancel`), or `None` when the
    /// substrate holds no unfinished job with this id.
    pub async fn cancel(&self, pool: &Db, id: i64) -> Result<Option<String>> {
        let sql = format!("SELECT {}($1)", self.name("qs_cancel"));
        Ok(sqlx::query_scalar(&sql).bind(id).fetch_one(pool).await?)
    }

    /// Retry a job now, as canonical's admin retry does (`qs_retry`): `Some("retried")`, or
    /// `Some(state)` when its state cannot be retried, or `None` when the substrate does not
    /// hold it.
    pub async fn retry<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        id: i64,
    ) -> Result<Option<String>> {
        let sql = format!("SELECT {}($1)", self.name("qs_retry"));
        Ok(sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_one(executor)
            .await?)
    }

    /// Delete the failed jobs of `kind` (optionally only in `queue`); the ids deleted.
    pub async fn discard_failed<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        kind: &str,
        queue: Option<&str>,
    ) -> Result<Vec<i64>> {
        let sql = format!("SELECT * FROM {}($1, $2)", self.name("qs_discard_failed"));
        Ok(sqlx::query_scalar(&sql)
            .bind(kind)
            .bind(queue)
            .fetch_all(executor)
            .await?)
    }

    /// One job as `qs_jobs` shows it (a scan: entries are not indexed by id).
    pub async fn job<'e, E: sqlx::PgExecutor<'e>>(&self, executor: E, id: i64) -> Result<JobRow> {
        self.jobs_by_id(executor, &[id])
            .await?
            .pop()
            .ok_or(AwaError::JobNotFound(id))
    }

    /// The jobs among `ids` as `qs_jobs` shows them, in id order, in one read (one scan,
    /// however many ids).
    pub async fn jobs_by_id<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
    ) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM {} WHERE id = ANY($1) ORDER BY id",
            self.name("qs_jobs")
        );
        let rows = sqlx::query(&sql).bind(ids).fetch_all(executor).await?;
        Ok(rows
            .iter()
            .map(JobRow::from_row)
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Move the failed jobs among `ids` into the DLQ (`qs_move_to_dlq`): with `reason`, or
    /// each job's last error; with `only_enabled`, only jobs of queues with the DLQ enabled.
    /// Returns the ids moved.
    pub async fn move_to_dlq<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
        reason: Option<&str>,
        only_enabled: bool,
    ) -> Result<Vec<i64>> {
        let sql = format!("SELECT * FROM {}($1, $2, $3)", self.name("qs_move_to_dlq"));
        Ok(sqlx::query_scalar(&sql)
            .bind(ids)
            .bind(reason)
            .bind(only_enabled)
            .fetch_all(executor)
            .await?)
    }

    /// Put dead-lettered jobs `ids` back on this engine (`qs_revive`) with the overrides
    /// given; returns the ids revived.
    pub async fn revive<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
        run_at: Option<DateTime<Utc>>,
        priority: Option<i16>,
        queue: Option<&str>,
    ) -> Result<Vec<i64>> {
        let sql = format!("SELECT * FROM {}($1, $2, $3, $4)", self.name("qs_revive"));
        Ok(sqlx::query_scalar(&sql)
            .bind(ids)
            .bind(run_at)
            .bind(priority)
            .bind(queue)
            .fetch_all(executor)
            .await?)
    }

    /// A batch operation's change to the queued jobs among `ids` (`qs_requeue`): each job
    /// changed, with its queue and state.
    pub(crate) async fn requeue(
        &self,
        conn: &mut PgConnection,
        ids: &[i64],
        queue: Option<&str>,
        priority: Option<i16>,
    ) -> Result<Vec<(i64, String, String)>> {
        let sql = format!("SELECT * FROM {}($1, $2, $3)", self.name("qs_requeue"));
        Ok(sqlx::query_as(&sql)
            .bind(ids)
            .bind(queue)
            .bind(priority)
            .fetch_all(&mut *conn)
            .await?)
    }

    /// Claim the oldest available job of `kind` in `queue` (the test harness's claim), with
    /// the attempt deadline `deadline` from now.
    pub async fn claim_kind(
        &self,
        pool: &Db,
        queue: &str,
        kind: &str,
        deadline: Duration,
    ) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT * FROM {}($1, $2, make_interval(secs => $3))",
            self.name("qs_claim_kind")
        );
        let rows = sqlx::query(&sql)
            .bind(queue)
            .bind(kind)
            .bind(deadline.as_secs_f64())
            .fetch_all(pool)
            .await?;
        Ok(rows
            .iter()
            .map(JobRow::from_row)
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Complete attempts `(ids[i], run_leases[i])`; returns the ids whose lease was still
    /// open (the others were rescued or already completed: stale, nothing written).
    pub async fn complete(&self, pool: &Db, ids: &[i64], run_leases: &[i64]) -> Result<Vec<i64>> {
        self.complete_in(pool, ids, run_leases).await
    }

    /// [`QueueStorage::complete`] through any executor, so a caller's transaction can insert
    /// the follow-ups of exactly the ids returned (ADR-046: inserted if and only if that
    /// attempt's completion commits) before it commits.
    pub async fn complete_in<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
        run_leases: &[i64],
    ) -> Result<Vec<i64>> {
        let done = self.complete_leases_in(executor, ids, run_leases).await?;
        Ok(done.into_iter().map(|(id, _)| id).collect())
    }

    /// [`QueueStorage::complete_in`] returning the `(id, run_lease)` pairs completed: a batch
    /// may hold a superseded attempt and the current one of the same job.
    pub async fn complete_leases_in<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
        run_leases: &[i64],
    ) -> Result<Vec<(i64, i64)>> {
        let sql = format!(
            "SELECT id, run_lease FROM {}($1, $2)",
            self.name("qs_complete")
        );
        Ok(sqlx::query_as(&sql)
            .bind(ids)
            .bind(run_leases)
            .fetch_all(executor)
            .await?)
    }

    /// Rescue attempts whose heartbeat is older than `stale` or whose deadline has passed:
    /// retryable (or failed when out of attempts). Returns the ids rescued.
    pub async fn rescue(&self, pool: &Db, stale: Duration) -> Result<Vec<i64>> {
        self.rescue_with_specs(pool, stale, &Specs::default()).await
    }

    /// [`QueueStorage::rescue`], firing the registered specs of the jobs it fails for good
    /// (`on_exhausted`) or cancels (a cancel was requested while they ran), in the same
    /// transaction, as canonical's rescue does.
    pub async fn rescue_with_specs(
        &self,
        pool: &Db,
        stale: Duration,
        specs: &Specs,
    ) -> Result<Vec<i64>> {
        let sql = format!(
            "SELECT * FROM {}(make_interval(secs => $1))",
            self.name("qs_rescue")
        );
        let mut tx = pool.begin().await?;
        let rescued: Vec<(i64, String, String)> = sqlx::query_as(&sql)
            .bind(stale.as_secs_f64())
            .fetch_all(&mut *tx)
            .await?;
        if rescued.is_empty() {
            tx.rollback().await?;
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = rescued.iter().map(|(id, ..)| *id).collect();
        if specs.has_any(SpecEvent::Exhausted) || specs.has_any(SpecEvent::Cancelled) {
            let mut follow_ups = Vec::new();
            for job in self.jobs_by_id(&mut *tx, &ids).await? {
                let event = match job.state {
                    JobState::Failed => SpecEvent::Exhausted,
                    JobState::Cancelled => SpecEvent::Cancelled,
                    _ => continue,
                };
                follow_ups.extend(specs.follow_ups(&job, event)?);
            }
            if !follow_ups.is_empty() {
                let refs: Vec<&NewJob> = follow_ups.iter().collect();
                self.enqueue_follow_ups(&mut *tx, &refs).await?;
            }
        }
        // Those it failed for good go to the DLQ where their queue sends failed jobs there,
        // in the same transaction (as canonical's rescue), with the rescue's reason.
        self.move_to_dlq(&mut *tx, &ids, None, true).await?;
        tx.commit().await?;
        // Counted and logged here, as canonical's rescue counts and logs its own.
        crate::metrics::series::record_each(
            rescued.iter().map(|(_, k, q)| (k.as_str(), q.as_str())),
            crate::metrics::series::JobEvent::Rescued,
        );
        crate::metrics::add(&crate::metrics::JOBS_RESCUED, ids.len() as u64);
        tracing::warn!(count = ids.len(), "rescued stuck jobs");
        Ok(ids)
    }

    /// Append every due deferred job to the current slot; returns how many.
    pub async fn promote(&self, pool: &Db) -> Result<i64> {
        let sql = format!("SELECT {}()", self.name("qs_promote"));
        Ok(sqlx::query_scalar(&sql).fetch_one(pool).await?)
    }

    /// One maintenance pass of the rings: reclaim the oldest queue slot if its history is
    /// older than `retention` (carrying forward what is live, and failed or cancelled jobs
    /// younger than `retention`), then move the queue ring on if the next slot is empty, then
    /// truncate empty lease slots and move the lease ring on. Each step is its own transaction.
    pub async fn rotate(&self, pool: &Db, retention: Duration) -> Result<Rotation> {
        let (carried, queue_slot) = self.rotate_queue_ring(pool, retention, retention).await?;
        let lease_slot = self.rotate_leases(pool).await?;
        Ok(Rotation {
            carried,
            queue_slot,
            lease_slot,
        })
    }

    /// The queue ring's part of [`Self::rotate`], with each history's own retention: the
    /// oldest slot is reclaimed once its completion receipts are older than `completed`, and
    /// its failed and cancelled jobs younger than `failed` are carried forward (so they are
    /// kept as long as canonical keeps them, without holding the slot). Returns the reclaim's
    /// carried count (`None` when nothing was reclaimed) and the new current slot (`None` when
    /// the ring did not move).
    pub async fn rotate_queue_ring(
        &self,
        pool: &Db,
        completed: Duration,
        failed: Duration,
    ) -> Result<(Option<i64>, Option<i32>)> {
        let reclaim = format!(
            "SELECT {}(make_interval(secs => $1), make_interval(secs => $2))",
            self.name("qs_reclaim_queue")
        );
        let carried: Option<i64> = sqlx::query_scalar(&reclaim)
            .bind(completed.as_secs_f64())
            .bind(failed.as_secs_f64())
            .fetch_one(pool)
            .await?;
        let rotate = format!("SELECT {}()", self.name("qs_rotate_queue"));
        let queue_slot: Option<i32> = sqlx::query_scalar(&rotate).fetch_one(pool).await?;
        Ok((carried, queue_slot))
    }

    /// Truncate every empty lease slot but the current one and move the lease ring on (the
    /// leases' dead tuples live until their slot is truncated, so this runs more often than
    /// the queue ring's rotation; awa-pg's default is every 50 ms). Returns the current slot.
    pub async fn rotate_leases(&self, pool: &Db) -> Result<i32> {
        self.rotate_leases_over(pool, 0).await
    }

    /// [`Self::rotate_leases`] only once the current lease slot's file holds at least
    /// `min_bytes` (0: always); otherwise nothing is locked or written. Returns the current
    /// slot.
    pub async fn rotate_leases_over(&self, pool: &Db, min_bytes: i64) -> Result<i32> {
        let sql = format!("SELECT {}($1)", self.name("qs_rotate_leases"));
        Ok(sqlx::query_scalar(&sql)
            .bind(min_bytes)
            .fetch_one(pool)
            .await?)
    }

    /// Every job the substrate holds, one row each, by id (the `qs_jobs` view, in
    /// canonical's states and columns).
    pub async fn jobs(&self, pool: &Db) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM {} ORDER BY id, state",
            self.name("qs_jobs")
        );
        let rows = sqlx::query(&sql).fetch_all(pool).await?;
        Ok(rows
            .iter()
            .map(JobRow::from_row)
            .collect::<std::result::Result<_, _>>()?)
    }

    /// The claim position of every lane.
    pub async fn lanes(&self, pool: &Db) -> Result<Vec<Lane>> {
        let sql = format!(
            "SELECT queue, priority, cursor, stable_seq FROM {} ORDER BY queue, priority",
            self.name("lanes")
        );
        let rows: Vec<(String, i16, i64, i64)> = sqlx::query_as(&sql).fetch_all(pool).await?;
        Ok(rows
            .into_iter()
            .map(|(queue, priority, cursor, stable_seq)| Lane {
                queue,
                priority,
                cursor,
                stable_seq,
            })
            .collect())
    }
}

/// Upgrade the functions of the queue-storage substrate the database has (the schema
/// `awa.runtime_storage_backends` names, once an install or a transition's prepare wrote it):
/// [`QueueStorage::upgrade_or_explain`]. Nothing to do (one read) without one.
pub(crate) async fn upgrade_installed(pool: &Db) -> Result<()> {
    let schema: Option<String> = sqlx::query_scalar(
        "SELECT schema_name FROM awa.runtime_storage_backends WHERE backend = 'queue_storage'",
    )
    .fetch_optional(pool)
    .await?;
    if let Some(schema) = schema {
        // The slot counts are the installed rings' own; an upgrade reads neither.
        let qs = QueueStorage::new(&schema, 16, 8)?;
        qs.upgrade_or_explain(pool).await?;
    }
    Ok(())
}

/// Marks a block of `functions.sql` written out once per lease slot, `{i}` standing for the
/// slot: a statement naming one slot's table is planned again only when that table changes.
const EACH_LEASE_SLOT: &str = "-- {each lease slot}\n";
const END_EACH_LEASE_SLOT: &str = "-- {end each lease slot}\n";

/// `functions.sql` for `schema` and a lease ring of `lease_slots` slots.
fn render_functions(schema: &str, lease_slots: i32) -> Result<String> {
    if !u32::try_from(lease_slots).is_ok_and(|n| SLOT_RANGE.contains(&n)) {
        return Err(AwaError::State(format!(
            "queue storage in schema \"{schema}\" has a lease ring of {lease_slots} slots; \
             it must have between {} and {}",
            SLOT_RANGE.start(),
            SLOT_RANGE.end()
        )));
    }
    let mut out = String::with_capacity(FUNCTIONS_SQL.len() * 2);
    let mut rest = FUNCTIONS_SQL;
    while let Some(at) = rest.find(EACH_LEASE_SLOT) {
        out.push_str(&rest[..at]);
        let body_start = at + EACH_LEASE_SLOT.len();
        let Some(len) = rest[body_start..].find(END_EACH_LEASE_SLOT) else {
            return Err(AwaError::State(
                "functions.sql: a per-lease-slot block is not closed".into(),
            ));
        };
        let body = &rest[body_start..body_start + len];
        for i in 0..lease_slots {
            out.push_str(&body.replace("{i}", &i.to_string()));
        }
        rest = &rest[body_start + len + END_EACH_LEASE_SLOT.len()..];
    }
    out.push_str(rest);
    Ok(out.replace("{s}", schema))
}

/// SQL dropping the substrate's functions in `schema`, by name and whatever their arguments
/// (only those: a schema shared with canonical keeps canonical's). `uninstall`: every function
/// of every script, with what depends on it (`CASCADE`: the trigger, which goes with its
/// table anyway). Otherwise (an upgrade) the functions of `functions.sql` but the trigger
/// functions, which are replaced in place (dropping one drops its trigger), and without
/// `CASCADE`: an object of the user's that calls one of them makes the upgrade fail, with
/// nothing changed, rather than disappear with it.
pub(crate) fn drop_functions_sql(schema: &str, uninstall: bool) -> String {
    let functions = if uninstall {
        QueueStorage::functions()
    } else {
        QueueStorage::versioned_functions()
    };
    let names: Vec<String> = functions.iter().map(|f| format!("'{f}'")).collect();
    let (keep, cascade) = if uninstall {
        ("", " CASCADE")
    } else {
        (" AND p.prorettype <> 'trigger'::regtype", "")
    };
    format!(
        "DO $$ DECLARE f regprocedure; BEGIN
             FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                      JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = '{schema}' AND p.proname IN ({}){keep}
             LOOP EXECUTE 'DROP FUNCTION ' || f || '{cascade}'; END LOOP;
         END $$;\n",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_lease_slot_blocks_are_written_once_per_slot() {
        let sql = render_functions("awa", 3).expect("renders");
        assert!(!sql.contains("{i}") && !sql.contains("{s}") && !sql.contains("{each"));
        for i in 0..3 {
            assert_eq!(
                sql.matches(&format!("DELETE FROM awa.leases_{i} l"))
                    .count(),
                1
            );
        }
        assert!(!sql.contains("awa.leases_3 "));
        assert!(render_functions("awa", 0).is_err());
    }
}

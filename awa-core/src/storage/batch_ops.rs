//! Durable batch operations (`awa.batch_operations`, migration 10; docs/batch-operations.md):
//! an operator's request to change many queued jobs at once, recorded as a row and applied
//! by the maintenance leader in small chunks ([`crate::maintenance::batch_ops`]).
//!
//! Two kinds exist, as in awa-pg: `set_priority` and `move_queue` (a new queue, optionally a
//! new priority too). Both touch only jobs that are still queued, `available` or
//! `scheduled`: a job that is running or finished is never changed under its worker.
//!
//! # The snapshot
//! An operation covers the jobs that match its filter, are queued, and whose id was assigned
//! before it was submitted (`snapshot_max_id`, the highest job id at submit time): jobs
//! inserted later are never part of it, whatever they look like. When the leader first picks
//! the operation up it counts that set (`total_matched`) and records the highest matching id
//! (`cursor.max_job_id`); it then walks the set in id order, [`CHUNK`] ids per transaction,
//! and stores the last id it handled (`cursor.after_job_id`) in the same transaction as the
//! changes, so a leader that takes over resumes exactly where the previous one committed.
//!
//! # Counters
//! `processed`: jobs changed. `skipped`: jobs of the set that needed no change (already at
//! the target priority and queue), plus, when the operation completes, every job counted in
//! `total_matched` that was neither processed nor skipped because it left `available` /
//! `scheduled` (it ran, was cancelled, ...) before the operation reached it. `errored` stays
//! 0: a chunk is one statement that either applies to all of its jobs or to none (a failed
//! chunk is retried on the next tick, with its error in `last_error`).
//!
//! Every call that changes jobs refuses an empty filter unless the caller says `allow_all`.
//!
//! # Both engines
//! Previews, the snapshot and its count read `awa.jobs` (both engines' jobs); a chunk takes
//! the next ids of both, changing canonical's rows in place and queue storage's jobs with
//! `qs_requeue` (an available job's entry is consumed and appended again: entries are never
//! updated).

use crate::error::{AwaError, Result};
use crate::model::job::{ts, JOB_COLUMNS};
use crate::model::validate::{check_queue, MAX_PRIORITY, MIN_PRIORITY};
use crate::model::{JobRow, JobState, ValidationError};
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, Row};

/// Jobs changed per transaction: small enough that a chunk's row locks are held for
/// milliseconds and a claimer (which skips locked rows) barely notices, large enough that a
/// million-job operation needs no more than a few thousand transactions.
pub(crate) const CHUNK: i64 = 500;

/// How many matching jobs a preview shows.
pub(crate) const PREVIEW_SAMPLE: i64 = 10;

/// How long a finished operation's row is kept before the maintenance leader deletes it
/// (`retention_until`), as in awa-pg: 90 days.
pub(crate) const RETENTION_DAYS: i32 = 90;

/// The job states an operation may change.
const QUEUED: [&str; 2] = ["available", "scheduled"];

/// Every operation state, in awa-pg's order (`BatchOperationState`).
pub(crate) const STATES: [&str; 7] = [
    "pending",
    "scanning",
    "running",
    "cancelling",
    "completed",
    "cancelled",
    "failed",
];

fn refused(message: impl Into<String>) -> AwaError {
    AwaError::BatchOperation(message.into())
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    SetPriority,
    MoveQueue,
}

impl OpKind {
    pub fn parse(text: &str) -> Result<OpKind> {
        match text {
            "set_priority" => Ok(OpKind::SetPriority),
            "move_queue" => Ok(OpKind::MoveQueue),
            other => Err(refused(format!(
                "unknown batch operation kind {other:?}; it must be set_priority or move_queue"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::SetPriority => "set_priority",
            OpKind::MoveQueue => "move_queue",
        }
    }
}

/// The change an operation applies to each job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchSpec {
    SetPriority {
        priority: i16,
    },
    /// A new queue, and a new priority when given.
    MoveQueue {
        queue: String,
        priority: Option<i16>,
    },
}

impl BatchSpec {
    pub fn kind(&self) -> OpKind {
        match self {
            BatchSpec::SetPriority { .. } => OpKind::SetPriority,
            BatchSpec::MoveQueue { .. } => OpKind::MoveQueue,
        }
    }

    /// The stored form, awa-pg's shape: the kind is repeated inside, and `move_queue` always
    /// carries `priority` (null when unchanged).
    pub fn to_json(&self) -> Value {
        match self {
            BatchSpec::SetPriority { priority } => {
                serde_json::json!({"op_kind": "set_priority", "priority": priority})
            }
            BatchSpec::MoveQueue { queue, priority } => {
                serde_json::json!({"op_kind": "move_queue", "queue": queue, "priority": priority})
            }
        }
    }

    /// Parse and check a spec as a caller sends it (or as it is stored).
    pub fn parse(kind: OpKind, spec: &Value) -> Result<BatchSpec> {
        let Some(map) = spec.as_object() else {
            return Err(refused(format!(
                "a batch operation spec must be an object, got {}",
                crate::model::validate::json_type_name(spec)
            )));
        };
        let allowed: &[&str] = match kind {
            OpKind::SetPriority => &["op_kind", "priority"],
            OpKind::MoveQueue => &["op_kind", "queue", "priority"],
        };
        for (key, value) in map {
            if !allowed.contains(&key.as_str()) {
                return Err(refused(format!(
                    "unknown {} spec key {key:?}; the keys are {}",
                    kind.as_str(),
                    allowed[1..].join(", ")
                )));
            }
            if key == "op_kind" && value != kind.as_str() {
                return Err(refused(format!(
                    "the spec's op_kind {value} does not match the operation's {:?}",
                    kind.as_str()
                )));
            }
        }
        let priority = match map.get("priority") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_priority(v)?),
        };
        match kind {
            OpKind::SetPriority => Ok(BatchSpec::SetPriority {
                priority: priority
                    .ok_or_else(|| refused("a set_priority spec needs a priority (1 to 4)"))?,
            }),
            OpKind::MoveQueue => {
                let queue = match map.get("queue") {
                    Some(Value::String(q)) => q.clone(),
                    None | Some(Value::Null) => {
                        return Err(refused("a move_queue spec needs a destination queue"))
                    }
                    Some(other) => {
                        return Err(refused(format!(
                            "the destination queue must be a string, got {}",
                            crate::model::validate::json_type_name(other)
                        )))
                    }
                };
                check_queue(&queue).map_err(|e| refused(format!("destination {e}")))?;
                Ok(BatchSpec::MoveQueue { queue, priority })
            }
        }
    }
}

fn parse_priority(v: &Value) -> Result<i16> {
    let Some(n) = v.as_i64() else {
        return Err(refused(format!(
            "priority must be an integer between {MIN_PRIORITY} and {MAX_PRIORITY}, got {v}"
        )));
    };
    match i16::try_from(n) {
        Ok(p) if (MIN_PRIORITY..=MAX_PRIORITY).contains(&p) => Ok(p),
        _ => Err(refused(ValidationError::Priority { value: n }.to_string())),
    }
}

/// Which jobs an operation addresses. Every given field must match; `None` matches all.
/// Stored with every key present (null when unset), as awa-pg stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchFilter {
    pub kind: Option<String>,
    pub queue: Option<String>,
    pub ids: Option<Vec<i64>>,
    /// Jobs carrying this tag.
    pub tag: Option<String>,
    /// `available` or `scheduled` only (the states an operation may change).
    pub state: Option<String>,
    #[serde(with = "ts::option", default)]
    pub created_at_gte: Option<DateTime<Utc>>,
    #[serde(with = "ts::option", default)]
    pub created_at_lt: Option<DateTime<Utc>>,
}

const FILTER_KEYS: [&str; 7] = [
    "kind",
    "queue",
    "ids",
    "tag",
    "state",
    "created_at_gte",
    "created_at_lt",
];

impl BatchFilter {
    /// Parse and check a filter as a caller sends it: an object (or null) with only the known
    /// keys. A null value is the same as an absent key. An unknown key is refused rather than
    /// ignored: a misspelt key would otherwise widen a bulk change to every queued job.
    pub fn parse(kind: OpKind, filter: Option<&Value>) -> Result<BatchFilter> {
        let map = match filter {
            None | Some(Value::Null) => return Ok(BatchFilter::default()),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(refused(format!(
                    "a batch operation filter must be an object, got {}",
                    crate::model::validate::json_type_name(other)
                )))
            }
        };
        let mut f = BatchFilter::default();
        for (key, value) in map {
            if value.is_null() {
                if !FILTER_KEYS.contains(&key.as_str()) {
                    return Err(unknown_filter_key(key));
                }
                continue;
            }
            match key.as_str() {
                "kind" => f.kind = Some(filter_text(key, value)?),
                "queue" => f.queue = Some(filter_text(key, value)?),
                "tag" => f.tag = Some(filter_text(key, value)?),
                "ids" => {
                    let Some(items) = value.as_array() else {
                        return Err(refused(format!(
                            "filter ids must be a list of job ids, got {}",
                            crate::model::validate::json_type_name(value)
                        )));
                    };
                    let ids = items
                        .iter()
                        .map(|v| {
                            v.as_i64().ok_or_else(|| {
                                refused(format!("filter ids must be integers, got {v}"))
                            })
                        })
                        .collect::<Result<Vec<i64>>>()?;
                    f.ids = Some(ids);
                }
                "state" => {
                    let state = filter_text(key, value)?;
                    let parsed = state
                        .parse::<JobState>()
                        .map_err(|e| refused(format!("filter state: {e}")))?;
                    if !QUEUED.contains(&parsed.as_str()) {
                        return Err(refused(format!(
                            "{} only changes queued jobs: the state filter must be available \
                             or scheduled, not {state:?}",
                            kind.as_str()
                        )));
                    }
                    f.state = Some(state);
                }
                "created_at_gte" => f.created_at_gte = Some(filter_instant(key, value)?),
                "created_at_lt" => f.created_at_lt = Some(filter_instant(key, value)?),
                other => return Err(unknown_filter_key(other)),
            }
        }
        Ok(f)
    }

    /// True when nothing narrows the set (an empty `ids` list does not count, as in awa-pg).
    pub fn is_unscoped(&self) -> bool {
        self.kind.is_none()
            && self.queue.is_none()
            && self.ids.as_ref().is_none_or(Vec::is_empty)
            && self.tag.is_none()
            && self.state.is_none()
            && self.created_at_gte.is_none()
            && self.created_at_lt.is_none()
    }

    /// The job states the filter admits: its own, or both queued states.
    fn states(&self) -> Vec<String> {
        match &self.state {
            Some(s) => vec![s.clone()],
            None => QUEUED.iter().map(|s| s.to_string()).collect(),
        }
    }
}

fn unknown_filter_key(key: &str) -> AwaError {
    refused(format!(
        "unknown batch operation filter key {key:?}; the keys are {}",
        FILTER_KEYS.join(", ")
    ))
}

fn filter_text(key: &str, value: &Value) -> Result<String> {
    match value {
        Value::String(s) if s.contains('\0') => Err(AwaError::BatchOperation(
            ValidationError::NulByte {
                field: format!("filter {key}"),
            }
            .to_string(),
        )),
        Value::String(s) => Ok(s.clone()),
        other => Err(refused(format!(
            "filter {key} must be a string, got {}",
            crate::model::validate::json_type_name(other)
        ))),
    }
}

fn filter_instant(key: &str, value: &Value) -> Result<DateTime<Utc>> {
    let Some(text) = value.as_str() else {
        return Err(refused(format!(
            "filter {key} must be a datetime or an RFC 3339 string, got {}",
            crate::model::validate::json_type_name(value)
        )));
    };
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            refused(format!(
                "filter {key} {text:?} is not an RFC 3339 timestamp: {e}"
            ))
        })
}

/// A checked request: what to change and which jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    pub spec: BatchSpec,
    pub filter: BatchFilter,
}

impl BatchRequest {
    /// Parse the three parts of a preview or submit call; every problem is an
    /// [`AwaError::BatchOperation`] naming the field.
    pub fn parse(op_kind: &str, spec: &Value, filter: Option<&Value>) -> Result<BatchRequest> {
        let kind = OpKind::parse(op_kind)?;
        Ok(BatchRequest {
            spec: BatchSpec::parse(kind, spec)?,
            filter: BatchFilter::parse(kind, filter)?,
        })
    }
}

/// The filter as SQL over `awa.jobs`, parameters `$1`..`$7` in [`bind_filter`]'s order.
const FILTER_SQL: &str = "($1::text IS NULL OR kind = $1)
      AND ($2::text IS NULL OR queue = $2)
      AND ($3::bigint[] IS NULL OR id = ANY($3))
      AND ($4::text IS NULL OR $4 = ANY(tags))
      AND state = ANY($5::text[])
      AND ($6::timestamptz IS NULL OR created_at >= $6)
      AND ($7::timestamptz IS NULL OR created_at < $7)";

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind_filter<'q>(query: PgQuery<'q>, filter: &'q BatchFilter) -> PgQuery<'q> {
    query
        .bind(filter.kind.as_deref())
        .bind(filter.queue.as_deref())
        .bind(filter.ids.clone())
        .bind(filter.tag.as_deref())
        .bind(filter.states())
        .bind(filter.created_at_gte)
        .bind(filter.created_at_lt)
}

/// What a submit would touch now: how many queued jobs match, and the first few by id.
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub total_matched: i64,
    pub sample: Vec<JobRow>,
}

/// Count the queued jobs `request` matches and show the first ten of them (by id).
/// Changes nothing; needs no `allow_all`.
pub async fn preview(pool: &Db, request: &BatchRequest) -> Result<Preview> {
    let count_sql = format!("SELECT count(*) FROM awa.jobs WHERE {FILTER_SQL}");
    let total_matched: i64 = bind_filter(sqlx::query(&count_sql), &request.filter)
        .fetch_one(pool)
        .await?
        .try_get(0)?;
    let sample_sql =
        format!("SELECT {JOB_COLUMNS} FROM awa.jobs WHERE {FILTER_SQL} ORDER BY id LIMIT $8");
    let rows = bind_filter(sqlx::query(&sample_sql), &request.filter)
        .bind(PREVIEW_SAMPLE)
        .fetch_all(pool)
        .await?;
    let sample = rows
        .iter()
        .map(|r| JobRow::from_row(r).map_err(AwaError::from))
        .collect::<Result<Vec<_>>>()?;
    Ok(Preview {
        total_matched,
        sample,
    })
}

/// One row of `awa.batch_operations`, with awa-pg's keys (`BatchOperation`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchOperation {
    pub id: String,
    pub op_kind: String,
    pub filter: Value,
    pub spec: Value,
    pub state: String,
    pub submitted_by: Option<String>,
    #[serde(with = "ts")]
    pub submitted_at: DateTime<Utc>,
    #[serde(with = "ts::option")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(with = "ts::option")]
    pub finalized_at: Option<DateTime<Utc>>,
    pub cursor: Option<Value>,
    pub total_matched: Option<i64>,
    pub processed: i64,
    pub skipped: i64,
    pub errored: i64,
    pub last_error: Option<String>,
    pub runner_instance: Option<String>,
    #[serde(with = "ts::option")]
    pub retention_until: Option<DateTime<Utc>>,
    #[serde(with = "ts")]
    pub updated_at: DateTime<Utc>,
}

const OP_COLUMNS: &str = "id::text AS id, op_kind, filter, spec, state, submitted_by, \
    submitted_at, started_at, finalized_at, cursor, total_matched, processed, skipped, errored, \
    last_error, runner_instance, retention_until, updated_at";

fn op_from_row(r: &sqlx::postgres::PgRow) -> std::result::Result<BatchOperation, sqlx::Error> {
    Ok(BatchOperation {
        id: r.try_get("id")?,
        op_kind: r.try_get("op_kind")?,
        filter: r.try_get("filter")?,
        spec: r.try_get("spec")?,
        state: r.try_get("state")?,
        submitted_by: r.try_get("submitted_by")?,
        submitted_at: r.try_get("submitted_at")?,
        started_at: r.try_get("started_at")?,
        finalized_at: r.try_get("finalized_at")?,
        cursor: r.try_get("cursor")?,
        total_matched: r.try_get("total_matched")?,
        processed: r.try_get("processed")?,
        skipped: r.try_get("skipped")?,
        errored: r.try_get("errored")?,
        last_error: r.try_get("last_error")?,
        runner_instance: r.try_get("runner_instance")?,
        retention_until: r.try_get("retention_until")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Record an operation for the maintenance leader to run; returns its row (`pending`).
/// Refuses a filter that narrows nothing unless `allow_all`. Any client may submit, whether
/// or not it runs workers: the operation runs once some runtime leads maintenance.
pub async fn submit(
    pool: &Db,
    request: &BatchRequest,
    submitted_by: Option<&str>,
    allow_all: bool,
) -> Result<BatchOperation> {
    if request.filter.is_unscoped() && !allow_all {
        return Err(refused(
            "a batch operation needs a filter (kind, queue, ids, tag, state, created_at_gte or \
             created_at_lt) or allow_all=True",
        ));
    }
    if submitted_by.is_some_and(|s| s.contains('\0')) {
        return Err(refused(
            ValidationError::NulByte {
                field: "submitted_by".into(),
            }
            .to_string(),
        ));
    }
    let sql = format!(
        "INSERT INTO awa.batch_operations (op_kind, filter, spec, submitted_by, snapshot_max_id)
         VALUES ($1, $2, $3, $4, (SELECT coalesce(max(id), 0) FROM awa.jobs))
         RETURNING {OP_COLUMNS}"
    );
    let row = sqlx::query(&sql)
        .bind(request.spec.kind().as_str())
        .bind(serde_json::to_value(&request.filter)?)
        .bind(request.spec.to_json())
        .bind(submitted_by)
        .fetch_one(pool)
        .await?;
    Ok(op_from_row(&row)?)
}

/// Check an operation state given by a caller.
pub fn parse_op_state(state: &str) -> Result<&'static str> {
    STATES.iter().copied().find(|s| *s == state).ok_or_else(|| {
        refused(format!(
            "unknown batch operation state {state:?}; it must be one of {}",
            STATES.join(", ")
        ))
    })
}

/// Check an operation id given by a caller: a UUID (hyphenated, or 32 hex digits, either
/// case); returns it in the canonical hyphenated lower-case form.
pub fn parse_op_id(id: &str) -> Result<String> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    let hyphens_ok = !id.contains('-')
        || (id.len() == 36 && [8, 13, 18, 23].iter().all(|&i| id.as_bytes()[i] == b'-'));
    if hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()) && hyphens_ok {
        // The canonical form (lower case, hyphenated), as the row's id reads back.
        let h = hex.to_ascii_lowercase();
        Ok(format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        ))
    } else {
        Err(refused(format!(
            "invalid batch operation id {id:?}: it must be a UUID"
        )))
    }
}

/// Operations, newest first (`submitted_at`), optionally in one state; at least one row is
/// asked for whatever `limit` says (awa-pg treats 0 and negative limits as 1).
pub async fn list<'e, E: PgExecutor<'e>>(
    executor: E,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<BatchOperation>> {
    let state = state.map(parse_op_state).transpose()?;
    let sql = format!(
        "SELECT {OP_COLUMNS} FROM awa.batch_operations WHERE ($1::text IS NULL OR state = $1)
         ORDER BY submitted_at DESC, id DESC LIMIT $2"
    );
    let rows = sqlx::query(&sql)
        .bind(state)
        .bind(limit.max(1))
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|r| op_from_row(r).map_err(AwaError::from))
        .collect()
}

fn not_found(id: &str) -> AwaError {
    refused(format!("batch operation {id} not found"))
}

/// One operation; an unknown id is an [`AwaError::BatchOperation`] (awa-pg raises
/// `ValidationError` for it too).
pub async fn get<'e, E: PgExecutor<'e>>(executor: E, id: &str) -> Result<BatchOperation> {
    let id = parse_op_id(id)?;
    let sql = format!("SELECT {OP_COLUMNS} FROM awa.batch_operations WHERE id = $1::uuid");
    let row = sqlx::query(&sql).bind(&id).fetch_optional(executor).await?;
    match row {
        Some(r) => Ok(op_from_row(&r)?),
        None => Err(not_found(&id)),
    }
}

/// Ask an operation to stop. One the leader has not started (`pending`) is cancelled at once
/// and has touched nothing; a running one becomes `cancelling`, and the leader ends it
/// (`cancelled`) before its next chunk, keeping the chunks already applied. An operation
/// that is already cancelling or finished is refused, as awa-pg refuses it.
pub async fn cancel(pool: &Db, id: &str) -> Result<BatchOperation> {
    let id = parse_op_id(id)?;
    let sql = format!(
        "UPDATE awa.batch_operations SET
             state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE 'cancelling' END,
             finalized_at = CASE WHEN state = 'pending' THEN now() END,
             retention_until = CASE WHEN state = 'pending'
                 THEN now() + make_interval(hours => 24 * $2) END,
             updated_at = now()
         WHERE id = $1::uuid AND state IN ('pending', 'scanning', 'running')
         RETURNING {OP_COLUMNS}"
    );
    if let Some(row) = sqlx::query(&sql)
        .bind(&id)
        .bind(RETENTION_DAYS)
        .fetch_optional(pool)
        .await?
    {
        return Ok(op_from_row(&row)?);
    }
    let op = get(pool, &id).await?;
    Err(refused(format!(
        "batch operation {id} is {}; only a pending or running operation can be cancelled",
        op.state
    )))
}

/// Delete finished operations whose `finalized_at` is before `before`, oldest first, at most
/// `limit` (at least 1, as in awa-pg); returns how many.
pub async fn purge<'e, E: PgExecutor<'e>>(
    executor: E,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM awa.batch_operations WHERE id IN (
             SELECT id FROM awa.batch_operations
             WHERE finalized_at IS NOT NULL AND finalized_at < $1
             ORDER BY finalized_at LIMIT $2)",
    )
    .bind(before)
    .bind(limit.max(1))
    .execute(executor)
    .await?;
    Ok(done.rows_affected())
}

/// Delete finished operations past their `retention_until`, at most `batch` (the leader's
/// retention duty).
pub(crate) async fn prune_expired(pool: &Db, batch: usize) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM awa.batch_operations WHERE id IN (
             SELECT id FROM awa.batch_operations
             WHERE finalized_at IS NOT NULL AND retention_until < now() LIMIT $1)",
    )
    .bind(i64::try_from(batch).unwrap_or(i64::MAX))
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

// ----- execution (driven by crate::maintenance::batch_ops) ----------------------------------

/// An active operation as the leader reads it to run its next step.
pub(crate) struct Claimed {
    pub id: String,
    pub op_kind: String,
    pub filter: Value,
    pub spec: Value,
    pub state: String,
    pub cursor: Option<Value>,
    pub total_matched: Option<i64>,
    pub processed: i64,
    pub skipped: i64,
    pub snapshot_max_id: i64,
}

/// The oldest active operation, locked for the caller's transaction (skipping one that a
/// cancel or another leader holds right now).
pub(crate) async fn claim_active(conn: &mut PgConnection) -> Result<Option<Claimed>> {
    let row = sqlx::query(
        "SELECT id::text AS id, op_kind, filter, spec, state, cursor, total_matched, processed,
                skipped, snapshot_max_id
         FROM awa.batch_operations
         WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
         ORDER BY submitted_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(Claimed {
        id: r.try_get("id")?,
        op_kind: r.try_get("op_kind")?,
        filter: r.try_get("filter")?,
        spec: r.try_get("spec")?,
        state: r.try_get("state")?,
        cursor: r.try_get("cursor")?,
        total_matched: r.try_get("total_matched")?,
        processed: r.try_get("processed")?,
        skipped: r.try_get("skipped")?,
        snapshot_max_id: r.try_get("snapshot_max_id")?,
    }))
}

/// The stored cursor: the last job id handled and the highest id of the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub after_job_id: i64,
    pub max_job_id: i64,
}

/// End an operation: `completed`, `cancelled` or `failed` (with `error`).
pub(crate) async fn finalize(
    conn: &mut PgConnection,
    id: &str,
    state: &str,
    runner: Option<&str>,
    error: Option<&str>,
    extra_skipped: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE awa.batch_operations SET state = $2, finalized_at = now(),
             retention_until = now() + make_interval(hours => 24 * $3), updated_at = now(),
             started_at = coalesce(started_at, now()),
             runner_instance = coalesce(runner_instance, $4),
             last_error = coalesce($5, last_error), skipped = skipped + $6
         WHERE id = $1::uuid",
    )
    .bind(id)
    .bind(state)
    .bind(RETENTION_DAYS)
    .bind(runner)
    .bind(error)
    .bind(extra_skipped.max(0))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Take the snapshot of a pending operation: count its jobs, note the highest id, and mark
/// it `running`. Returns the cursor and the count.
pub(crate) async fn scan(
    conn: &mut PgConnection,
    op: &Claimed,
    filter: &BatchFilter,
    runner: Option<&str>,
) -> Result<(Cursor, i64)> {
    let sql = format!(
        "SELECT count(*) AS n, coalesce(max(id), 0) AS top FROM awa.jobs
         WHERE {FILTER_SQL} AND id <= $8"
    );
    let row = bind_filter(sqlx::query(&sql), filter)
        .bind(op.snapshot_max_id)
        .fetch_one(&mut *conn)
        .await?;
    let total: i64 = row.try_get("n")?;
    let cursor = Cursor {
        after_job_id: 0,
        max_job_id: row.try_get("top")?,
    };
    sqlx::query(
        "UPDATE awa.batch_operations SET state = 'running', started_at = now(),
             runner_instance = $2, total_matched = $3, cursor = $4, updated_at = now()
         WHERE id = $1::uuid",
    )
    .bind(&op.id)
    .bind(runner)
    .bind(total)
    .bind(serde_json::to_value(cursor)?)
    .execute(&mut *conn)
    .await?;
    Ok((cursor, total))
}

/// What one chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkDone {
    /// Queued jobs of the snapshot this chunk looked at (and locked).
    pub seen: i64,
    /// Of those, the ones changed.
    pub changed: i64,
    /// The cursor after the chunk.
    pub cursor: Cursor,
}

/// Apply the operation to the next `chunk` queued jobs after the cursor, and store the new
/// cursor and counters with them (one transaction: the caller's).
pub(crate) async fn apply_chunk(
    conn: &mut PgConnection,
    op: &Claimed,
    filter: &BatchFilter,
    spec: &BatchSpec,
    cursor: Cursor,
    chunk: i64,
) -> Result<ChunkDone> {
    // Lock the chunk first, in id order. Claimers skip locked rows, so they never wait on
    // this; a row a claimer holds is waited for and then re-checked, so a job that has just
    // started running is left alone.
    let ids = chunk_ids(
        conn,
        "awa.canonical_jobs",
        "FOR UPDATE",
        filter,
        cursor,
        chunk,
    )
    .await?;
    let (queue, priority) = match spec {
        BatchSpec::SetPriority { priority } => (None, Some(*priority)),
        BatchSpec::MoveQueue { queue, priority } => (Some(queue.as_str()), *priority),
    };
    // The queue-storage jobs of the snapshot next to canonical's: the chunk is the first
    // `chunk` ids of both, in id order (canonical rows locked past the cut are let go at
    // commit, untouched).
    let qs = crate::storage::routing::readable_queue_storage(&mut *conn).await?;
    let (ids, qs_ids) = match &qs {
        None => (ids, Vec::new()),
        Some(qs) => {
            let source = format!("{}.qs_jobs", qs.schema());
            let theirs = chunk_ids(conn, &source, "", filter, cursor, chunk).await?;
            split_chunk(ids, theirs, chunk.max(1))
        }
    };
    // Only rows that really change are written (and counted as processed); a job already at
    // the target is skipped, as in awa-pg.
    let mut moved: Vec<(String, String)> = sqlx::query_as(
        "UPDATE awa.canonical_jobs SET queue = coalesce($2, queue), priority = coalesce($3, priority)
         WHERE id = ANY($1) AND state IN ('available', 'scheduled')
           AND (($2::text IS NOT NULL AND queue <> $2)
                OR ($3::smallint IS NOT NULL AND priority <> $3))
         RETURNING queue, state",
    )
    .bind(&ids)
    .bind(queue)
    .bind(priority)
    .fetch_all(&mut *conn)
    .await?;
    if let (Some(qs), false) = (&qs, qs_ids.is_empty()) {
        for (_, q, state) in qs.requeue(&mut *conn, &qs_ids, queue, priority).await? {
            moved.push((q, state));
        }
    }
    let seen = i64::try_from(ids.len() + qs_ids.len()).unwrap_or(i64::MAX);
    let changed = i64::try_from(moved.len()).unwrap_or(i64::MAX);
    let last = ids.last().copied().max(qs_ids.last().copied());
    let next = Cursor {
        after_job_id: last.unwrap_or(cursor.max_job_id),
        max_job_id: cursor.max_job_id,
    };
    sqlx::query(
        "UPDATE awa.batch_operations SET processed = processed + $2, skipped = skipped + $3,
             cursor = $4, last_error = NULL, updated_at = now()
         WHERE id = $1::uuid",
    )
    .bind(&op.id)
    .bind(changed)
    .bind(seen - changed)
    .bind(serde_json::to_value(next)?)
    .execute(&mut *conn)
    .await?;
    // Workers of the destination queue learn of its new available jobs at commit.
    let mut woken: Vec<String> = moved
        .into_iter()
        .filter(|(_, state)| state == "available")
        .map(|(q, _)| q)
        .collect();
    woken.sort();
    woken.dedup();
    if !woken.is_empty() {
        crate::storage::wake_queues(&mut *conn, &woken).await?;
    }
    Ok(ChunkDone {
        seen,
        changed,
        cursor: next,
    })
}

/// The next `chunk` ids of `source` (canonical's table, or a queue-storage schema's
/// `qs_jobs`) that the operation covers after the cursor, in id order; `lock` is appended
/// (`FOR UPDATE` on canonical's table).
async fn chunk_ids(
    conn: &mut PgConnection,
    source: &str,
    lock: &str,
    filter: &BatchFilter,
    cursor: Cursor,
    chunk: i64,
) -> Result<Vec<i64>> {
    let sql = format!(
        "SELECT id FROM {source} WHERE {FILTER_SQL} AND id > $8 AND id <= $9
         ORDER BY id LIMIT $10 {lock}"
    );
    Ok(bind_filter(sqlx::query(&sql), filter)
        .bind(cursor.after_job_id)
        .bind(cursor.max_job_id)
        .bind(chunk.max(1))
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<std::result::Result<_, _>>()?)
}

/// The first `chunk` ids of two ascending id lists (canonical's and queue storage's), each
/// list keeping its own: what one chunk of an operation over both engines covers.
fn split_chunk(ours: Vec<i64>, theirs: Vec<i64>, chunk: i64) -> (Vec<i64>, Vec<i64>) {
    let mut all: Vec<i64> = ours.iter().chain(theirs.iter()).copied().collect();
    all.sort_unstable();
    let Some(&cut) = all.get(
        usize::try_from(chunk)
            .unwrap_or(usize::MAX)
            .saturating_sub(1),
    ) else {
        return (ours, theirs);
    };
    (
        ours.into_iter().filter(|id| *id <= cut).collect(),
        theirs.into_iter().filter(|id| *id <= cut).collect(),
    )
}

/// Record a chunk's failure on the row (the operation stays active and is retried).
pub(crate) async fn record_error(pool: &Db, id: &str, error: &str) -> Result<()> {
    sqlx::query(
        "UPDATE awa.batch_operations SET last_error = $2, updated_at = now() WHERE id = $1::uuid",
    )
    .bind(id)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// Parse an operation's stored kind, spec and filter back (written by [`submit`], so they
/// parse unless someone edited the row by hand).
pub(crate) fn stored_request(op: &Claimed) -> Result<BatchRequest> {
    let kind = OpKind::parse(&op.op_kind)?;
    let filter: BatchFilter = serde_json::from_value(op.filter.clone())
        .map_err(|e| refused(format!("stored filter does not parse: {e}")))?;
    Ok(BatchRequest {
        spec: BatchSpec::parse(kind, &op.spec)?,
        filter,
    })
}

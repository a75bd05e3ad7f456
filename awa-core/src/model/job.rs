//! A row of `awa.jobs`, as every read returns it.

use super::state::JobState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgRow;
use sqlx::Row;

/// The columns every query that returns jobs selects, in [`JobRow`]'s order.
pub(crate) const JOB_COLUMNS: &str =
    "id, kind, queue, args, state, priority, attempt, max_attempts, \
    run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, \
    tags, unique_key, unique_states, callback_id::text AS callback_id, callback_timeout_at, \
    run_lease, progress, ordering_key";

/// Timestamps serialize as RFC 3339 text exactly as awa-pg's `Job` shows them (chrono's
/// `to_rfc3339`): an explicit `+00:00` offset and as many fractional digits as needed (none,
/// 3 or 6: PostgreSQL keeps microseconds), e.g. `2026-12-03T13:28:23.620739+00:00` or
/// `2099-01-01T00:00:00+00:00`. The Python `Job` hands these strings out unchanged, and every
/// supported Python parses them with `datetime.fromisoformat`.
pub(crate) mod ts {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    fn text(t: &DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::AutoSi, false)
    }

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&text(t)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<DateTime<Utc>>::deserialize(d)
        }
    }
}

/// One entry of a job's `errors` history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    pub attempt: i32,
    #[serde(with = "ts")]
    pub at: DateTime<Utc>,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
    /// Set on the entry of an attempt that failed for good by the handler's own verdict
    /// (`TerminalError`, a failed stage), as awa-pg's entries carry it; `dump_run` reads it.
    /// Absent (not `false`) otherwise, so stored entries keep awa-pg's shape.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminal: bool,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub queue: String,
    pub args: serde_json::Value,
    pub state: JobState,
    pub priority: i16,
    pub attempt: i32,
    pub max_attempts: i32,
    #[serde(with = "ts")]
    pub run_at: DateTime<Utc>,
    #[serde(with = "ts::option", default)]
    pub heartbeat_at: Option<DateTime<Utc>>,
    #[serde(with = "ts::option", default)]
    pub deadline_at: Option<DateTime<Utc>>,
    #[serde(with = "ts::option", default)]
    pub attempted_at: Option<DateTime<Utc>>,
    #[serde(with = "ts::option", default)]
    pub finalized_at: Option<DateTime<Utc>>,
    #[serde(with = "ts")]
    pub created_at: DateTime<Utc>,
    pub errors: Vec<JobError>,
    pub metadata: serde_json::Value,
    pub tags: Vec<String>,
    #[serde(skip)]
    pub unique_key: Option<Vec<u8>>,
    pub unique_states: Option<i16>,
    pub callback_id: Option<String>,
    #[serde(with = "ts::option", default)]
    pub callback_timeout_at: Option<DateTime<Utc>>,
    pub run_lease: i64,
    pub progress: Option<serde_json::Value>,
    pub ordering_key: Option<String>,
}

impl JobRow {
    /// Decode a row selected with [`JOB_COLUMNS`].
    pub(crate) fn from_row(row: &PgRow) -> Result<JobRow, sqlx::Error> {
        let state: String = row.try_get("state")?;
        let state = state
            .parse::<JobState>()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        let errors: serde_json::Value = row.try_get("errors")?;
        let errors: Vec<JobError> =
            serde_json::from_value(errors).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        Ok(JobRow {
            id: row.try_get("id")?,
            kind: row.try_get("kind")?,
            queue: row.try_get("queue")?,
            args: row.try_get("args")?,
            state,
            priority: row.try_get("priority")?,
            attempt: row.try_get("attempt")?,
            max_attempts: row.try_get("max_attempts")?,
            run_at: row.try_get("run_at")?,
            heartbeat_at: row.try_get("heartbeat_at")?,
            deadline_at: row.try_get("deadline_at")?,
            attempted_at: row.try_get("attempted_at")?,
            finalized_at: row.try_get("finalized_at")?,
            created_at: row.try_get("created_at")?,
            errors,
            metadata: row.try_get("metadata")?,
            tags: row.try_get("tags")?,
            unique_key: row.try_get("unique_key")?,
            unique_states: row.try_get("unique_states")?,
            callback_id: row.try_get("callback_id")?,
            callback_timeout_at: row.try_get("callback_timeout_at")?,
            run_lease: row.try_get("run_lease")?,
            progress: row.try_get("progress")?,
            ordering_key: row.try_get("ordering_key")?,
        })
    }
}

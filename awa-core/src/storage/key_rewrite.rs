//! The upgrade step of migration 9: rewrite unique keys from the old SHA-256 form to awa's
//! BLAKE3 layout ([`crate::model::unique_key`]), in the migration's own transaction.
//!
//! A row does not record which parts its key was built from, so the step recovers them: it
//! recomputes the old key for each combination of `by_queue` and `by_args` from the row's own
//! kind, queue and args, and, for `by_period` keys, for the common period lengths and the
//! buckets of the row's `run_at` and `created_at` (the old key bucketed the insert's `run_at`,
//! or the time of the insert). The first combination that reproduces the stored key gives the
//! parts, and the row gets the new key of the same parts. A row whose parts cannot be
//! recovered (a period outside [`PERIODS`], or args whose JSON changed on the way through
//! jsonb, such as `-0.0`) keeps its old 32-byte key: it still deduplicates against other old
//! rows, but no longer against new inserts. The step logs how many rows that was.
//!
//! Old keys are told from new ones by length (32 bytes against 16), so the step is idempotent
//! and a second run finds nothing to do.

use crate::model::unique_key::{self, KeyParts};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, Row};

/// The name recorded in `awa.pending_steps` by migration 9.
pub(crate) const STEP: &str = "rewrite_unique_keys_blake3";

/// Length of an old SHA-256 key.
const OLD_KEY_LEN: i32 = 32;

/// Rows read and updated per round trip.
const BATCH: i64 = 1000;

/// Period lengths (seconds) tried when recovering a `by_period` key: minute, 5, 10, 15 and 30
/// minutes, hour, 2, 3, 4, 6, 8 and 12 hours, day, week, 30 days.
pub const PERIODS: &[i64] = &[
    60, 300, 600, 900, 1800, 3600, 7200, 10_800, 14_400, 21_600, 28_800, 43_200, 86_400, 604_800,
    2_592_000,
];

/// What the step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RewriteReport {
    pub rewritten: u64,
    pub unresolved: u64,
}

/// The key the library computed before migration 9, for the same parts (SHA-256 with textual
/// separators, the period bucket big-endian). Kept only to recognise old keys.
pub fn legacy_key(
    kind: &str,
    queue: Option<&str>,
    args: Option<&Value>,
    bucket: Option<i64>,
) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(b"kind\0");
    h.update(kind.as_bytes());
    if let Some(queue) = queue {
        h.update(b"\0queue\0");
        h.update(queue.as_bytes());
    }
    if let Some(args) = args {
        h.update(b"\0args\0");
        h.update(serde_json::to_vec(args).unwrap_or_default());
    }
    if let Some(bucket) = bucket {
        h.update(b"\0period\0");
        h.update(bucket.to_be_bytes());
    }
    h.finalize().to_vec()
}

/// One row's new key, when its parts can be recovered from the old one.
fn recover(
    old: &[u8],
    kind: &str,
    queue: &str,
    args: &Value,
    times: [DateTime<Utc>; 2],
) -> Option<Vec<u8>> {
    const COMBOS: [(bool, bool); 4] = [(false, true), (true, true), (false, false), (true, false)];
    let new_key = |by_queue: bool, by_args: bool, bucket: Option<i64>| {
        unique_key::compute(KeyParts {
            kind,
            queue: by_queue.then_some(queue),
            args: by_args.then_some(args),
            period_bucket: bucket,
        })
    };
    for (by_queue, by_args) in COMBOS {
        let q = by_queue.then_some(queue);
        let a = by_args.then_some(args);
        if legacy_key(kind, q, a, None) == old {
            return Some(new_key(by_queue, by_args, None));
        }
    }
    for &period in PERIODS {
        for at in times {
            let base = at.timestamp().div_euclid(period);
            // The insert's clock may have been a moment before the row's created_at.
            for bucket in [base, base - 1] {
                for (by_queue, by_args) in COMBOS {
                    let q = by_queue.then_some(queue);
                    let a = by_args.then_some(args);
                    if legacy_key(kind, q, a, Some(bucket)) == old {
                        return Some(new_key(by_queue, by_args, Some(bucket)));
                    }
                }
            }
        }
    }
    None
}

/// Rewrite every old key in canonical's table. Runs inside the caller's transaction (the
/// migration's, holding the migration lock), in batches by id. The table is `awa.jobs` before
/// migration 13 and `awa.canonical_jobs` from it on; a step recorded by migration 9 may run
/// at either.
pub(crate) async fn rewrite(conn: &mut PgConnection) -> Result<RewriteReport, sqlx::Error> {
    let mut report = RewriteReport::default();
    let mut after: i64 = i64::MIN;
    let table: String = sqlx::query_scalar(
        "SELECT coalesce(to_regclass('awa.canonical_jobs'), to_regclass('awa.jobs'))::text",
    )
    .fetch_one(&mut *conn)
    .await?;
    let select = format!(
        "SELECT id, kind, queue, args, unique_key, run_at, created_at FROM {table}
         WHERE id > $1 AND unique_key IS NOT NULL AND length(unique_key) = $2
         ORDER BY id LIMIT $3"
    );
    let update = format!(
        "UPDATE {table} j SET unique_key = u.key
         FROM unnest($1::bigint[], $2::bytea[]) AS u(id, key) WHERE j.id = u.id"
    );
    loop {
        let rows = sqlx::query(&select)
            .bind(after)
            .bind(OLD_KEY_LEN)
            .bind(BATCH)
            .fetch_all(&mut *conn)
            .await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = last.try_get("id")?;
        let mut ids = Vec::with_capacity(rows.len());
        let mut keys = Vec::with_capacity(rows.len());
        for row in &rows {
            let old: Vec<u8> = row.try_get("unique_key")?;
            let kind: String = row.try_get("kind")?;
            let queue: String = row.try_get("queue")?;
            let args: Value = row.try_get("args")?;
            let times = [row.try_get("run_at")?, row.try_get("created_at")?];
            match recover(&old, &kind, &queue, &args, times) {
                Some(key) => {
                    ids.push(row.try_get::<i64, _>("id")?);
                    keys.push(key);
                }
                None => report.unresolved += 1,
            }
        }
        if !ids.is_empty() {
            let done = sqlx::query(&update)
                .bind(&ids)
                .bind(&keys)
                .execute(&mut *conn)
                .await?;
            report.rewritten += done.rows_affected();
        }
    }
    if report.unresolved > 0 {
        tracing::warn!(
            rewritten = report.rewritten,
            unresolved = report.unresolved,
            "unique keys whose parts could not be recovered keep their old form; they no \
             longer deduplicate against new inserts (docs/unique-keys.md, \"Upgrading\")"
        );
    } else {
        tracing::info!(
            rewritten = report.rewritten,
            "unique keys rewritten to BLAKE3"
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    #[test]
    fn recovers_each_combination_and_a_period_bucket() {
        let args = json!({"b": 1, "a": [1, 2]});
        let created = Utc.timestamp_opt(1_700_000_123, 0).single().unwrap();
        let times = [created, created];
        for (by_queue, by_args) in [(false, false), (true, false), (false, true), (true, true)] {
            let q = by_queue.then_some("q");
            let a = by_args.then_some(&args);
            let old = legacy_key("k", q, a, None);
            let expect = unique_key::compute(KeyParts {
                kind: "k",
                queue: q,
                args: a,
                period_bucket: None,
            });
            assert_eq!(recover(&old, "k", "q", &args, times), Some(expect));
            // A job inserted a moment before created_at's hour began.
            let bucket = created.timestamp().div_euclid(3600) - 1;
            let old = legacy_key("k", q, a, Some(bucket));
            let expect = unique_key::compute(KeyParts {
                kind: "k",
                queue: q,
                args: a,
                period_bucket: Some(bucket),
            });
            assert_eq!(recover(&old, "k", "q", &args, times), Some(expect));
        }
        // A period outside the list, or other args, are not recovered.
        let odd = legacy_key("k", None, None, Some(created.timestamp().div_euclid(1234)));
        assert_eq!(recover(&odd, "k", "q", &args, times), None);
        let other = legacy_key("k", None, Some(&json!({"c": 1})), None);
        assert_eq!(recover(&other, "k", "q", &args, times), None);
    }
}

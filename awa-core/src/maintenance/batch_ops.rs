//! The maintenance leader's execution of durable batch operations (the SQL and the
//! semantics are in [`crate::storage::batch_ops`]).
//!
//! Each [`step`] is one transaction on the oldest active operation: record a requested
//! cancel, take a pending operation's snapshot, or apply one chunk and advance the stored
//! cursor. Because the cursor commits with the chunk it describes, a leader that dies
//! between steps loses nothing and a new leader's next step continues from the last commit.
//! The leader runs steps for at most [`TICK_BUDGET`] per maintenance tick, so a large
//! operation never delays promotion and rescue for long.

use crate::error::{is_transient, AwaError, Result};
use crate::storage::batch_ops::{self as store, Cursor};
use crate::storage::pool::Db;
use std::time::{Duration, Instant};

/// How long one maintenance tick may spend on batch operations.
pub(crate) const TICK_BUDGET: Duration = Duration::from_millis(200);

/// Longest a chunk waits for a job row another transaction holds; past it the chunk is
/// rolled back and retried on a later tick.
const LOCK_TIMEOUT: &str = "2s";

/// What one [`step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No operation is active.
    Idle,
    /// The operation's snapshot was taken (it is now `running`).
    Scanned { id: String, total_matched: i64 },
    /// One chunk was applied.
    Chunk {
        id: String,
        changed: i64,
        skipped: i64,
        cursor: Cursor,
    },
    /// The operation ended in this state (`completed`, `cancelled` or `failed`).
    Finished { id: String, state: String },
}

/// Run one step of the oldest active operation, `chunk` jobs at most; `runner` is recorded
/// as the operation's `runner_instance` (the leader's runtime registry id). Public so that
/// tests (and tools without a runtime) can drive operations by hand.
pub async fn step(pool: &Db, runner: Option<&str>, chunk: i64) -> Result<Step> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        .execute(&mut *tx)
        .await?;
    let Some(op) = store::claim_active(&mut tx).await? else {
        return Ok(Step::Idle);
    };
    if op.state == "cancelling" {
        store::finalize(&mut tx, &op.id, "cancelled", runner, None, 0).await?;
        tx.commit().await?;
        return Ok(Step::Finished {
            id: op.id,
            state: "cancelled".into(),
        });
    }
    let request = match store::stored_request(&op) {
        Ok(r) => r,
        Err(e) => {
            // A row edited by hand into something this version cannot run: end it, say why.
            store::finalize(&mut tx, &op.id, "failed", runner, Some(&e.to_string()), 0).await?;
            tx.commit().await?;
            return Ok(Step::Finished {
                id: op.id,
                state: "failed".into(),
            });
        }
    };
    let cursor = match (&op.state[..], &op.cursor) {
        ("running", Some(c)) => serde_json::from_value::<Cursor>(c.clone()).ok(),
        _ => None,
    };
    let Some(cursor) = cursor else {
        // Pending (or a running row without a readable cursor): take the snapshot.
        let (cursor, total_matched) = store::scan(&mut tx, &op, &request.filter, runner).await?;
        tx.commit().await?;
        tracing::info!(operation = %op.id, total_matched, max_job_id = cursor.max_job_id,
            "batch operation started");
        return Ok(Step::Scanned {
            id: op.id,
            total_matched,
        });
    };
    if cursor.after_job_id >= cursor.max_job_id {
        // Every job of the snapshot was handled; the ones that left the queued states before
        // their chunk came are counted as skipped.
        let unaccounted = op.total_matched.unwrap_or(0) - op.processed - op.skipped;
        store::finalize(&mut tx, &op.id, "completed", runner, None, unaccounted).await?;
        tx.commit().await?;
        tracing::info!(operation = %op.id, "batch operation completed");
        return Ok(Step::Finished {
            id: op.id,
            state: "completed".into(),
        });
    }
    let done =
        store::apply_chunk(&mut tx, &op, &request.filter, &request.spec, cursor, chunk).await?;
    tx.commit().await?;
    Ok(Step::Chunk {
        id: op.id,
        changed: done.changed,
        skipped: done.seen - done.changed,
        cursor: done.cursor,
    })
}

/// The leader's duty: run steps until nothing is active or [`TICK_BUDGET`] is spent.
/// A failed step is logged and recorded on the operation (`last_error`); the operation stays
/// active and the step is retried on the next tick, from the last committed cursor.
pub(crate) async fn tick(pool: &Db, runner: Option<&str>) {
    // One indexed read when nothing is active (the usual case), instead of a transaction.
    let active: std::result::Result<bool, sqlx::Error> = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM awa.batch_operations
                        WHERE state IN ('pending', 'scanning', 'running', 'cancelling'))",
    )
    .fetch_one(pool)
    .await;
    match active.map_err(AwaError::from) {
        Ok(true) => {}
        Ok(false) | Err(AwaError::SchemaNotMigrated { .. }) => return,
        Err(e) => {
            tracing::warn!(error = %e, "reading batch operations failed");
            return;
        }
    }
    let started = Instant::now();
    while started.elapsed() < TICK_BUDGET {
        match step(pool, runner, store::CHUNK).await {
            Ok(Step::Idle) => return,
            Ok(_) => {}
            Err(e) => {
                if !matches!(&e, AwaError::SchemaNotMigrated { .. }) {
                    tracing::warn!(error = %e, "batch operation step failed");
                    note_failure(pool, &e).await;
                }
                return;
            }
        }
    }
}

/// Put a failed step's error on the operation it was working on (the oldest active one), so
/// an operator reading the row sees why it is not moving. Transient failures (a deadlock
/// with a concurrent claim, a lost connection) are only logged.
async fn note_failure(pool: &Db, e: &AwaError) {
    if let AwaError::Database(db) = e {
        if is_transient(db) {
            return;
        }
    }
    let oldest: Option<String> = sqlx::query_scalar(
        "SELECT id::text FROM awa.batch_operations
         WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
         ORDER BY submitted_at, id LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .ok()
    .flatten();
    if let Some(id) = oldest {
        let _ = store::record_error(pool, &id, &e.to_string()).await;
    }
}

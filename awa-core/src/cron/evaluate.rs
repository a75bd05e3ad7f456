//! The leader's periodic duty: enqueue every due fire exactly once.
//!
//! For each unpaused schedule the leader computes the due fires after `last_enqueued_at`
//! and then, in ONE transaction, advances `last_enqueued_at` with a compare-and-set on the
//! values it read (`last_enqueued_at` and `updated_at`) and inserts the fires' jobs. Whoever
//! loses the race (a second leader after a failover, a leader whose connection broke, a
//! definition changed or paused meanwhile) updates no row, rolls back, and so inserts
//! nothing; a crash before the commit leaves both unchanged for the next leader. So each fire
//! time is enqueued at most once, and at least once unless the missed-fire policy drops it.

use super::fault::{check, CronPoint};
use super::schedule::Schedule;
use super::storage::{CronJobRow, MissedFirePolicy, ROW_COLUMNS};
use crate::error::Result;
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use std::time::{Duration, Instant};

/// How often the leader evaluates schedules.
pub const EVALUATE_EVERY: Duration = Duration::from_secs(1);

/// At most this many fires are enqueued per schedule and evaluation; a `catch_up` schedule
/// with more missed fires continues with the rest on the next evaluation (a second later).
pub const CATCH_UP_LIMIT: usize = 100;

/// A fire at most this old when the leader evaluates it is on time, not missed: the
/// evaluation cadence alone makes fires up to about a second late, and `coalesce` must not
/// drop a second-granular schedule's fires because of that.
pub const MISSED_AFTER: Duration = Duration::from_secs(5);

/// Which fires in `(after, now]` to enqueue, earliest first.
///
/// `catch_up`: all of them (at most [`CATCH_UP_LIMIT`]). `coalesce`: the on-time ones (at
/// most [`MISSED_AFTER`] old) and, when older fires were missed, the latest missed one in
/// their place.
pub fn due_fires(
    schedule: &Schedule,
    policy: MissedFirePolicy,
    after: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    match policy {
        MissedFirePolicy::CatchUp => schedule.fires_between(after, now, CATCH_UP_LIMIT),
        MissedFirePolicy::Coalesce => {
            let grace = chrono::Duration::from_std(MISSED_AFTER).unwrap_or_default();
            let on_time_from = (now - grace).max(after);
            let mut fires: Vec<_> = schedule
                .latest_between(after, on_time_from)
                .into_iter()
                .collect();
            let room = CATCH_UP_LIMIT.saturating_sub(fires.len());
            fires.extend(schedule.fires_between(on_time_from, now, room));
            fires
        }
    }
}

/// Rate-limits [`evaluate`] to [`EVALUATE_EVERY`] inside the leader loop.
pub(crate) struct Ticker {
    last: Option<Instant>,
}

impl Ticker {
    pub(crate) fn new() -> Self {
        Ticker { last: None }
    }

    /// Evaluate when due; errors are logged (the next tick tries again).
    pub(crate) async fn tick(&mut self, pool: &Db) {
        if self.last.is_some_and(|l| l.elapsed() < EVALUATE_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        match evaluate(pool).await {
            Ok(n) if n > 0 => tracing::debug!(enqueued = n, "periodic jobs enqueued"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "periodic job evaluation failed"),
        }
    }
}

/// Evaluate every due schedule against the database clock; returns how many jobs were
/// enqueued. Safe to call from several processes at once (see the module docs).
pub async fn evaluate(pool: &Db) -> Result<usize> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await?;
    evaluate_at(pool, now).await
}

/// [`evaluate`] with "now" given by the caller (tests and tools use a fixed clock).
pub async fn evaluate_at(pool: &Db, now: DateTime<Utc>) -> Result<usize> {
    let rows = sqlx::query(&format!(
        "SELECT {ROW_COLUMNS} FROM awa.cron_jobs
         WHERE NOT paused AND (next_fire_at IS NULL OR next_fire_at <= $1)
         ORDER BY name"
    ))
    .bind(now)
    .fetch_all(pool)
    .await?;
    let mut enqueued = 0;
    for r in &rows {
        let row = CronJobRow::from_row(r)?;
        match evaluate_one(pool, &row, now).await {
            Ok(n) => enqueued += n,
            Err(e) => {
                tracing::warn!(schedule = %row.name, error = %e, "periodic job not evaluated")
            }
        }
    }
    Ok(enqueued)
}

/// One schedule: compute its due fires, then CAS + insert in one transaction.
async fn evaluate_one(pool: &Db, row: &CronJobRow, now: DateTime<Utc>) -> Result<usize> {
    let schedule: Schedule = row
        .schedule()
        .map_err(|e| crate::error::AwaError::Config(e.to_string()))?;
    let policy = MissedFirePolicy::parse(&row.missed_fire_policy)?;
    // A schedule that never fired counts from its creation: registering one does not
    // enqueue fires from before it existed.
    let after = row.last_enqueued_at.unwrap_or(row.created_at);
    let fires = due_fires(&schedule, policy, after, now);
    let new_last = fires.last().copied().or(row.last_enqueued_at);
    // The next fire not yet handled: after `now` unless the catch-up limit left some due.
    let next = schedule.next_after(new_last.unwrap_or(after));
    let jobs = fires
        .iter()
        .map(|at| row.job_for(*at, false))
        .collect::<Result<Vec<_>>>()?;

    let mut tx = pool.begin().await?;
    let won = sqlx::query(
        "UPDATE awa.cron_jobs SET last_enqueued_at = $2, next_fire_at = $3
         WHERE name = $1 AND NOT paused
           AND last_enqueued_at IS NOT DISTINCT FROM $4 AND updated_at = $5",
    )
    .bind(&row.name)
    .bind(new_last)
    .bind(next)
    .bind(row.last_enqueued_at)
    .bind(row.updated_at)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !won {
        // Someone else advanced, paused, changed or deleted it since we read it.
        tx.rollback().await?;
        return Ok(0);
    }
    crate::storage::routing::insert_jobs_in(&mut tx, pool, &jobs).await?;
    check(CronPoint::BeforeCommit, &row.name)?;
    tx.commit().await?;
    check(CronPoint::AfterCommit, &row.name)?;
    Ok(jobs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn strs(v: Vec<DateTime<Utc>>) -> Vec<String> {
        v.into_iter()
            .map(|d| d.format("%H:%M:%S").to_string())
            .collect()
    }

    #[test]
    fn coalesce_keeps_on_time_fires_and_collapses_missed_ones() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        // Evaluated 1.5 s late: both fires are on time.
        assert_eq!(
            strs(due_fires(
                &s,
                MissedFirePolicy::Coalesce,
                utc("2026-01-01T10:00:00Z"),
                utc("2026-01-01T10:00:02.5Z")
            )),
            ["10:00:01", "10:00:02"]
        );
        // The leader was away for a minute: the 55 missed fires collapse into 10:00:54.
        assert_eq!(
            strs(due_fires(
                &s,
                MissedFirePolicy::Coalesce,
                utc("2026-01-01T10:00:00Z"),
                utc("2026-01-01T10:01:00Z")
            )),
            ["10:00:55", "10:00:56", "10:00:57", "10:00:58", "10:00:59", "10:01:00"]
        );
        let hourly = Schedule::parse("0 * * * *", "UTC").unwrap();
        assert_eq!(
            strs(due_fires(
                &hourly,
                MissedFirePolicy::Coalesce,
                utc("2026-01-01T05:30:00Z"),
                utc("2026-01-01T10:30:00Z")
            )),
            ["10:00:00"]
        );
    }

    #[test]
    fn catch_up_is_ordered_and_bounded() {
        let hourly = Schedule::parse("0 * * * *", "UTC").unwrap();
        assert_eq!(
            strs(due_fires(
                &hourly,
                MissedFirePolicy::CatchUp,
                utc("2026-01-01T05:30:00Z"),
                utc("2026-01-01T10:30:00Z")
            )),
            ["06:00:00", "07:00:00", "08:00:00", "09:00:00", "10:00:00"]
        );
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let fires = due_fires(
            &s,
            MissedFirePolicy::CatchUp,
            utc("2026-01-01T10:00:00Z"),
            utc("2026-01-01T11:00:00Z"),
        );
        assert_eq!(fires.len(), CATCH_UP_LIMIT);
        assert_eq!(fires[0], utc("2026-01-01T10:00:01Z"));
    }

    #[test]
    fn nothing_due() {
        let s = Schedule::parse("0 9 * * *", "Europe/London").unwrap();
        for policy in [MissedFirePolicy::Coalesce, MissedFirePolicy::CatchUp] {
            assert!(due_fires(
                &s,
                policy,
                utc("2026-06-01T08:00:00Z"),
                utc("2026-06-01T08:30:00Z")
            )
            .is_empty());
        }
    }
}

//! Recommended pool settings for Awa's workload.
//!
//! sqlx's default pool pings every connection before handing it out (`test_before_acquire`),
//! which costs one extra round trip per insert, claim, heartbeat and completion batch: on a
//! local server that ping is a third of a single insert's latency. Awa's statements are
//! short and frequent, so a connection that was used a moment ago is known to be alive. These
//! options ping only a connection that sat idle for longer than [`IDLE_PING_AFTER`] (the rule
//! pgx's pool uses); a connection that dies while in use surfaces as an I/O error, which every
//! Awa path already retries or reports.

use sqlx::postgres::{PgPoolOptions, Postgres};
use sqlx::Connection;
use std::time::Duration;

/// A connection idle for longer than this is pinged before it is handed out.
pub const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// Pool options with the idle-only health check; set `max_connections` and connect as usual.
pub fn pool_options() -> PgPoolOptions {
    sqlx::pool::PoolOptions::<Postgres>::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > IDLE_PING_AFTER {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

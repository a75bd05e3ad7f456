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

/// How long [`close_pool`] waits for connections still being handed back.
const CLOSE_SETTLE: Duration = Duration::from_secs(5);

/// Close `pool` and every connection it holds.
///
/// sqlx 0.8.6's `Pool::close` can return while a connection is still open. A connection
/// handed back to the pool is first pinged (one round trip) and only then pushed to the idle
/// queue; `close` pops the idle queue and then waits for every permit, but closing an idle
/// connection gives back a permit that connection did not hold, so the wait can end while
/// another connection is still in its ping, and that one then lands in the idle queue of a
/// closed pool and stays there, an idle server backend, for as long as the pool value lives.
/// Measured: half of the clients that ran two statements and closed kept a backend, and a
/// full run of the Python suite climbed to 150 of them, past `max_connections`. So: close,
/// then close again until the pool counts no connection (new acquires already fail), for at
/// most [`CLOSE_SETTLE`] in case a caller still holds one.
pub async fn close_pool(pool: &sqlx::PgPool) {
    pool.close().await;
    let deadline = tokio::time::Instant::now() + CLOSE_SETTLE;
    while pool.size() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
        pool.close().await;
    }
}

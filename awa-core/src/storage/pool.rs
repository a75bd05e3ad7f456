//! Connecting to PostgreSQL: one connect path for every connection Awa opens.
//!
//! - [`ConnectTarget`] is a parsed database URL: sqlx's [`PgConnectOptions`] (host, port,
//!   credentials and libpq's TLS parameters `sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
//!   from the URL or the `PG*` environment variables), a bounded connect timeout, and the
//!   [`PoolMode`]. The pool, the LISTEN listener, the maintenance leader's connection and
//!   migrations all connect through it, so TLS, the timeout and the error messages are the
//!   same everywhere.
//! - [`Db`] is the pool handle every Awa path runs its statements on. Behind PgBouncer in
//!   transaction pooling mode ([`PoolMode::Transaction`]) it runs every statement inside an
//!   explicit transaction; see [`Db`] for why.
//! - [`pool_options`]: the recommended pool settings.
//!
//! sqlx's default pool pings every connection before handing it out (`test_before_acquire`),
//! which costs one extra round trip per insert, claim, heartbeat and completion batch: on a
//! local server that ping is a third of a single insert's latency. Awa's statements are
//! short and frequent, so a connection that was used a moment ago is known to be alive. These
//! options ping only a connection that sat idle for longer than [`IDLE_PING_AFTER`] (the rule
//! pgx's pool uses); a connection that dies while in use surfaces as an I/O error, which every
//! Awa path already retries or reports.

use crate::error::{AwaError, ConnectFailure, Result};
use crate::storage::engine::Engine;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgQueryResult, PgRow, PgStatement,
    PgTypeInfo, Postgres,
};
use sqlx::{Connection, Either, Execute, Executor, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// A connection idle for longer than this is pinged before it is handed out.
pub const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// How long one connection attempt may take when neither the URL's `connect_timeout` nor
/// `PGCONNECT_TIMEOUT` says otherwise. libpq waits forever by default; a job queue that
/// cannot reach its database should say so within seconds, not hang.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The statement that opens every transaction in [`PoolMode::Transaction`]: `BEGIN`, then drop
/// any named prepared statement an earlier client left on the server connection PgBouncer
/// just assigned (one simple-query message, one round trip).
const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

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

/// How the server end of a connection behaves between transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A connection is one server session (PostgreSQL directly, or PgBouncer in session
    /// mode): LISTEN, session advisory locks and sqlx's prepared-statement cache work.
    Session,
    /// PgBouncer (or a similar pooler) in transaction pooling mode: consecutive transactions
    /// of one connection may run on different server sessions. Chosen with the URL parameter
    /// `pool_mode=transaction`.
    Transaction,
}

/// Where and how to connect: a parsed database URL. Cheap to clone. Its `Debug` output leaves
/// out the credentials.
#[derive(Clone)]
pub struct ConnectTarget {
    options: PgConnectOptions,
    connect_timeout: Option<Duration>,
    mode: PoolMode,
}

impl std::fmt::Debug for ConnectTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectTarget")
            .field("address", &self.address())
            .field("user", &self.options.get_username())
            .field("database", &self.options.get_database())
            .field("ssl_mode", &self.options.get_ssl_mode())
            .field("connect_timeout", &self.connect_timeout)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl ConnectTarget {
    /// Parse a `postgres://` URL. Besides sqlx's parameters (`sslmode`, `sslrootcert`,
    /// `sslcert`, `sslkey`, `application_name`, `options`, ...; anything the URL leaves out
    /// comes from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`,
    /// `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), it reads:
    /// - `connect_timeout`: seconds one connection attempt may take (libpq's parameter; else
    ///   `PGCONNECT_TIMEOUT`; else [`DEFAULT_CONNECT_TIMEOUT`]; `0` waits forever);
    /// - `pool_mode`: `session` (the default) or `transaction` (behind PgBouncer in
    ///   transaction pooling mode, see [`Db`]).
    ///
    /// A malformed URL is an [`AwaError::InvalidUrl`] that never repeats the URL (it may hold
    /// a password).
    pub fn parse(url: &str) -> Result<ConnectTarget> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(AwaError::InvalidUrl(
                "it must start with postgres:// or postgresql://".into(),
            ));
        }
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut kept = Vec::new();
        let mut timeout_text = None;
        let mut mode_text = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "connect_timeout" => timeout_text = Some(value.to_string()),
                "pool_mode" => mode_text = Some(value.to_string()),
                _ => kept.push(pair),
            }
        }
        let sqlx_url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut options = PgConnectOptions::from_str(&sqlx_url).map_err(|e| {
            // sqlx's messages name the bad part (scheme, port, sslmode value), not the URL.
            AwaError::InvalidUrl(url_error(&e))
        })?;
        let timeout_text = timeout_text.or_else(|| std::env::var("PGCONNECT_TIMEOUT").ok());
        let connect_timeout = match timeout_text {
            None => Some(DEFAULT_CONNECT_TIMEOUT),
            Some(t) => parse_timeout(&t)?,
        };
        let mode = match mode_text.as_deref() {
            None | Some("session") => PoolMode::Session,
            Some("transaction") => PoolMode::Transaction,
            Some(other) => {
                return Err(AwaError::InvalidUrl(format!(
                    "pool_mode={other:?}; it must be \"session\" or \
                     \"transaction\""
                )))
            }
        };
        if mode == PoolMode::Transaction {
            // Statements are prepared anew in every transaction (see `Db`), and PgBouncer
            // refuses startup parameters it does not know, such as extra_float_digits.
            options = options.statement_cache_capacity(0).extra_float_digits(None);
        }
        Ok(ConnectTarget {
            options,
            connect_timeout,
            mode,
        })
    }

    /// `host:port` (or the socket path) the target points at, for messages.
    pub fn address(&self) -> String {
        match self.options.get_socket() {
            Some(dir) => format!(
                "{} (socket, port {})",
                dir.display(),
                self.options.get_port()
            ),
            None => format!("{}:{}", self.options.get_host(), self.options.get_port()),
        }
    }

    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// The bound on one connection attempt (`None`: wait forever).
    pub fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// Open one connection outside any pool (the listener's, the leader's, a probe), within
    /// the connect timeout; a failure is an [`AwaError::Connect`] naming the address and the
    /// cause.
    pub async fn connect(&self) -> Result<PgConnection> {
        self.connect_raw().await.map_err(AwaError::from)
    }

    /// [`ConnectTarget::connect`] with the failure as a `sqlx::Error` (an I/O error wrapping
    /// the [`ConnectFailure`]), for code that speaks sqlx's error type.
    pub(crate) async fn connect_raw(&self) -> Result<PgConnection, sqlx::Error> {
        let attempt = PgConnection::connect_with(&self.options);
        let outcome = match self.connect_timeout {
            Some(limit) => match tokio::time::timeout(limit, attempt).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(self.failure(format!(
                        "timed out after {} s (connect_timeout)",
                        limit.as_secs_f64()
                    )))
                }
            },
            None => attempt.await,
        };
        outcome.map_err(|e| self.failure(describe_cause(&e)))
    }

    fn failure(&self, cause: String) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::other(ConnectFailure {
            address: self.address(),
            cause,
        }))
    }

    /// A pool over this target that connects lazily, with [`pool_options`].
    pub fn pool(&self, max_connections: u32) -> Db {
        let pool = pool_options()
            .max_connections(max_connections.max(1))
            .connect_lazy_with(self.options.clone());
        Db::with_target(pool, self.clone())
    }
}

fn parse_timeout(text: &str) -> Result<Option<Duration>> {
    let secs: f64 = text.trim().parse().map_err(|_| {
        AwaError::InvalidUrl(format!(
            "connect_timeout={text:?}; it must be a number of seconds"
        ))
    })?;
    if !secs.is_finite() || secs > 86_400.0 {
        return Err(AwaError::InvalidUrl(format!(
            "connect_timeout={text:?}; it must be a number of seconds \
             up to 86400 (0 waits forever)"
        )));
    }
    Ok((secs > 0.0).then(|| Duration::from_secs_f64(secs)))
}

/// sqlx's URL error without its wrapper text.
fn url_error(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Configuration(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// Why a connection attempt failed, as a short phrase: "connection refused", "no such host",
/// the server's own text for authentication and authorization failures (with SQLSTATE),
/// "certificate verify failed" for a certificate that does not verify.
fn describe_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".into()
        }
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionReset => {
            "the server closed the connection (connection reset)".into()
        }
        // rustls reports a certificate it rejects through the TLS stream's I/O error.
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            let text = match e {
                sqlx::Error::Io(io) => io.to_string(),
                other => other.to_string(),
            };
            if text.contains("lookup address") || text.contains("Name or service not known") {
                format!("no such host ({text})")
            } else if text.contains("invalid peer certificate") {
                format!("certificate verify failed ({text})")
            } else if text.contains("does not support TLS") {
                "the server does not accept TLS connections (sslmode requires TLS)".into()
            } else {
                text
            }
        }
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_string(),
        },
        other => other.to_string(),
    }
}

/// The pool every Awa path runs its statements on: a [`PgPool`] plus the [`ConnectTarget`]
/// it was made from. Cheap to clone. `&Db` is a sqlx executor.
///
/// # Behind PgBouncer in transaction pooling mode
///
/// PgBouncer (1.18, Debian 12's) assigns a server session to a client only for the length of
/// a transaction; outside one, each `Sync` of the extended protocol may end the assignment.
/// sqlx sends a statement with parameters as Parse/Describe/Sync, then Bind/Execute/Sync, so
/// the two halves could reach different sessions, and it names its prepared statements
/// (`sqlx_s_1`, ...) per client connection, so a name one client left on a session collides
/// with the next client's. In [`PoolMode::Transaction`] `Db` therefore
/// - runs every statement given to `&Db` inside its own explicit transaction (the session
///   stays assigned for every round trip of it);
/// - opens every transaction, its own and [`Db::begin`]'s, with [`PINNED_BEGIN`] (`BEGIN;
///   DEALLOCATE ALL`), so no statement name left behind by anyone can collide;
/// - connects with sqlx's statement cache off, so no name is reused across transactions.
///
/// The runtime also starts no LISTEN connection (dispatchers poll) and elects its leader with
/// a transaction-scoped advisory lock held in one open transaction (see
/// `maintenance`), so nothing relies on session state. Costs: two or three more round trips
/// per statement than in [`PoolMode::Session`].
#[derive(Debug, Clone)]
pub struct Db {
    pool: PgPool,
    target: Arc<ConnectTarget>,
    /// The storage engine the runtime's statements go to (see [`crate::storage::engine`]).
    engine: Engine,
    /// Where new jobs go, as last read (see [`crate::storage::routing`]); shared by clones.
    route: Arc<crate::storage::routing::RouteCache>,
}

impl From<PgPool> for Db {
    /// A pool built by the caller: its connect options, session mode.
    fn from(pool: PgPool) -> Db {
        let target = ConnectTarget {
            options: pool.connect_options().as_ref().clone(),
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            mode: PoolMode::Session,
        };
        Db::with_target(pool, target)
    }
}

impl Db {
    fn with_target(pool: PgPool, target: ConnectTarget) -> Db {
        Db {
            pool,
            target: Arc::new(target),
            engine: Engine::Canonical,
            route: Arc::default(),
        }
    }

    /// This pool with the runtime's statements going to `engine` (claims, heartbeats,
    /// finalizations, follow-ups, rescue, promotion, rotation). The pool is shared.
    pub fn with_engine(&self, engine: Engine) -> Db {
        Db {
            engine,
            ..self.clone()
        }
    }

    /// The storage engine this handle's runtime statements go to.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn route_cache(&self) -> &crate::storage::routing::RouteCache {
        &self.route
    }

    /// A pool built by the caller, used in `mode` (the caller's options should then have the
    /// statement cache off, as [`ConnectTarget::parse`] sets it for `pool_mode=transaction`).
    pub fn with_mode(pool: PgPool, mode: PoolMode) -> Db {
        let mut db = Db::from(pool);
        Arc::make_mut(&mut db.target).mode = mode;
        db
    }

    /// The sqlx pool underneath. Statements run on it directly bypass the transaction-mode
    /// handling; use `&Db` instead.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn target(&self) -> &ConnectTarget {
        &self.target
    }

    pub fn mode(&self) -> PoolMode {
        self.target.mode
    }

    /// Open a transaction on a pooled connection.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let tx = match self.mode() {
            PoolMode::Session => self.pool.begin().await,
            PoolMode::Transaction => self.pool.begin_with(PINNED_BEGIN).await,
        };
        match tx {
            Err(e) => Err(self.explain(e).await),
            ok => ok,
        }
    }

    /// Open a transaction on `conn` (a connection taken with [`Db::acquire`]).
    pub async fn begin_on<'c>(
        &self,
        conn: &'c mut PgConnection,
    ) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
        match self.mode() {
            PoolMode::Session => conn.begin().await,
            PoolMode::Transaction => conn.begin_with(PINNED_BEGIN).await,
        }
    }

    /// A pooled connection. In [`PoolMode::Transaction`] run statements on it only inside
    /// [`Db::begin_on`]'s transactions.
    pub async fn acquire(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        match self.pool.acquire().await {
            Err(e) => Err(self.explain(e).await),
            ok => ok,
        }
    }

    /// Close the pool and every connection it holds (see [`close_pool`]).
    pub async fn close(&self) {
        close_pool(&self.pool).await
    }

    /// Open one connection now and close it: the constructor's fail-fast check, with the
    /// precise cause of a failure.
    pub async fn check(&self) -> Result<()> {
        let conn = self.target.connect().await?;
        let _ = conn.close().await;
        Ok(())
    }

    /// "pool timed out" says nothing about why: when the pool could not hand out a
    /// connection, try one connection directly and report its failure instead (address and
    /// cause). When that connection works, the pool really was busy; keep the error.
    async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
        if !matches!(e, sqlx::Error::PoolTimedOut) {
            return e;
        }
        match self.target.connect_raw().await {
            Ok(conn) => {
                let _ = conn.close().await;
                e
            }
            Err(failure) => failure,
        }
    }

    /// Run one statement in its own transaction (transaction mode): all its round trips on
    /// one server session.
    async fn pinned<'q, E>(
        &self,
        query: E,
    ) -> Result<Vec<Either<PgQueryResult, PgRow>>, sqlx::Error>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let mut tx = self.begin().await?;
        let items: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
        tx.commit().await?;
        Ok(items)
    }
}

impl<'p> Executor<'p> for &'_ Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        match db.mode() {
            // The pool's own stream; a pool timeout is explained (address, cause).
            PoolMode::Session => Box::pin(self.pool.fetch_many(query).then(move |item| {
                let db = db.clone();
                async move {
                    match item {
                        Err(e) => Err(db.explain(e).await),
                        ok => ok,
                    }
                }
            })),
            PoolMode::Transaction => Box::pin(
                futures_util::stream::once(async move { db.pinned(query).await })
                    .map_ok(|items| futures_util::stream::iter(items.into_iter().map(Ok)))
                    .try_flatten(),
            ),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        Box::pin(async move {
            match db.mode() {
                PoolMode::Session => match db.pool.fetch_optional(query).await {
                    Err(e) => Err(db.explain(e).await),
                    ok => ok,
                },
                PoolMode::Transaction => {
                    let mut tx = db.begin().await?;
                    let row = (&mut *tx).fetch_optional(query).await?;
                    tx.commit().await?;
                    Ok(row)
                }
            }
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>> {
        let db = self.clone();
        Box::pin(async move { db.acquire().await?.prepare_with(sql, parameters).await })
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>> {
        let db = self.clone();
        Box::pin(async move { db.acquire().await?.describe(sql).await })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_parameters_are_read_and_removed() {
        let t = ConnectTarget::parse(
            "postgres://u:pw@db.example:6432/app?connect_timeout=2.5&pool_mode=transaction&sslmode=require",
        )
        .expect("parse");
        assert_eq!(t.connect_timeout(), Some(Duration::from_millis(2500)));
        assert_eq!(t.mode(), PoolMode::Transaction);
        assert_eq!(t.address(), "db.example:6432");
        assert!(matches!(
            t.options().get_ssl_mode(),
            sqlx::postgres::PgSslMode::Require
        ));
        let forever = ConnectTarget::parse("postgres://u@h/db?connect_timeout=0").expect("parse");
        assert_eq!(forever.connect_timeout(), None);
    }

    #[test]
    fn bad_urls_never_echo_the_password() {
        for url in [
            "postgres://u:s3cret@h:notaport/db",
            "postgres://u:s3cret@h/db?connect_timeout=soon",
            "postgres://u:s3cret@h/db?pool_mode=statement",
            "mysql://u:s3cret@h/db",
            "postgres://u:s3cret@h/db?sslmode=sometimes",
        ] {
            let e = ConnectTarget::parse(url).expect_err(url);
            let text = e.to_string();
            assert!(matches!(e, AwaError::InvalidUrl(_)), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
            assert!(text.starts_with("invalid database URL"), "{url}: {text}");
        }
    }
}

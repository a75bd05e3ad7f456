//! Shared test support: every test gets its own database, dropped when the test ends.
#![allow(dead_code)]

use awa_core::storage::pool::Db;
use sqlx::{Connection, Executor, PgConnection};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Job ids each test database of this process may use: one block per database.
pub const ID_BLOCK: i64 = 1_000_000;
static NEXT_ID_BLOCK: AtomicI64 = AtomicI64::new(1);

pub fn base_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn url_for(db: &str) -> String {
    let base = base_url();
    let (prefix, rest) = base
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{prefix}/{db}{query}")
}

/// A throwaway database; dropped (forcibly) on drop.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: Db,
}

impl TestDb {
    /// A new, migrated database whose job ids no other database of this test binary uses.
    ///
    /// Fault seams and their hit counts are process-wide and keyed by job id, and a fresh
    /// sequence starts at 1, so two tests running in parallel would otherwise share ids and
    /// could fire (or count) each other's faults. Every migrated test database therefore
    /// starts its ids at a block of its own; a test cannot forget to ask for it.
    pub async fn new() -> TestDb {
        let db = TestDb::empty().await;
        db.migrate().await;
        db
    }

    /// Migrate this database and move its job ids to a block of their own (see [`TestDb::new`]).
    pub async fn migrate(&self) {
        awa_core::migrate(&self.pool).await.expect("migrate");
        self.isolate_ids().await;
    }

    /// Move this database's job ids to a block no other test database of this process uses.
    pub async fn isolate_ids(&self) {
        let start = NEXT_ID_BLOCK.fetch_add(1, Ordering::SeqCst) * ID_BLOCK;
        sqlx::query(&format!(
            "ALTER SEQUENCE awa.jobs_id_seq RESTART WITH {start}"
        ))
        .execute(&self.pool)
        .await
        .expect("restart the id sequence");
    }

    /// A new database without the awa schema. A test that migrates it itself and then arms
    /// id-keyed seams must migrate it with [`TestDb::migrate`], which isolates its ids.
    pub async fn empty() -> TestDb {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!(
            "awa_rs_{}_{}_{}",
            std::process::id(),
            n,
            chrono::Utc::now().timestamp_micros() % 1_000_000
        );
        let mut admin = PgConnection::connect(&base_url())
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .expect("create database");
        let url = url_for(&name);
        let pool = awa_core::pool_options()
            .max_connections(20)
            .connect(&url)
            .await
            .expect("connect")
            .into();
        TestDb { name, url, pool }
    }

    pub async fn pool(&self, max: u32) -> Db {
        awa_core::pool_options()
            .max_connections(max)
            .connect(&self.url)
            .await
            .expect("connect")
            .into()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // DROP ... WITH (FORCE) ends the pool's connections (closing the pool would wait on the
        // blocked runtime).
        cleanup_on_own_thread(async move {
            if let Ok(mut admin) = PgConnection::connect(&base_url()).await {
                let _ = admin
                    .execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
                    .await;
            }
        });
    }
}

/// Run a cleanup from a `Drop`: drop runs inside the test's runtime, which is blocked there, so
/// the cleanup gets a thread and a runtime of its own and is waited for.
fn cleanup_on_own_thread(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(cleanup);
        }
    })
    .join();
}

/// The grants `docs/deploying.md` ("Roles and grants") tells the schema owner to give the
/// application role, read from the document itself so the two cannot drift apart.
pub fn documented_grants(role: &str) -> String {
    let doc = include_str!("../../../docs/deploying.md");
    let block = doc
        .split_once("<!-- grants:begin -->")
        .and_then(|(_, rest)| rest.split_once("<!-- grants:end -->"))
        .map(|(block, _)| block)
        .expect("docs/deploying.md has a grants block");
    let sql = block
        .trim()
        .trim_start_matches("```sql")
        .trim_end_matches("```");
    sql.replace("awa_app", &format!("\"{role}\""))
}

/// A login role of its own (roles are cluster-wide, so the name is unique per test), with
/// no rights beyond what it is explicitly granted. Dropped on drop, after its privileges
/// in `db` are revoked.
pub struct TestRole {
    pub name: String,
    db_url: String,
}

impl TestRole {
    /// A new role on the cluster of `db`, with nothing granted.
    pub async fn new(db: &TestDb, tag: &str) -> TestRole {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("awa_role_{tag}_{}_{n}", std::process::id());
        let mut admin = PgConnection::connect(&base_url())
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(format!("CREATE ROLE \"{name}\" LOGIN").as_str())
            .await
            .expect("create role");
        TestRole {
            name,
            db_url: db.url.clone(),
        }
    }

    /// Run, as the owner, the grants of `docs/deploying.md` for this role.
    pub async fn grant_documented(&self, db: &TestDb) {
        sqlx::raw_sql(&documented_grants(&self.name))
            .execute(&db.pool)
            .await
            .expect("run the documented grants");
    }

    /// Connection options for `db` as this role.
    pub fn options(&self) -> sqlx::postgres::PgConnectOptions {
        let opts: sqlx::postgres::PgConnectOptions =
            self.db_url.parse().expect("parse the database url");
        opts.username(&self.name)
    }

    /// A pool on `db` connected as this role.
    pub async fn pool(&self, max: u32) -> Db {
        awa_core::pool_options()
            .max_connections(max)
            .connect_with(self.options())
            .await
            .expect("connect as the role")
            .into()
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let name = self.name.clone();
        let db_url = self.db_url.clone();
        cleanup_on_own_thread(async move {
            if let Ok(mut conn) = PgConnection::connect(&db_url).await {
                let _ = conn
                    .execute(format!("DROP OWNED BY \"{name}\"").as_str())
                    .await;
            }
            if let Ok(mut admin) = PgConnection::connect(&base_url()).await {
                let _ = admin
                    .execute(format!("DROP ROLE IF EXISTS \"{name}\"").as_str())
                    .await;
            }
        });
    }
}

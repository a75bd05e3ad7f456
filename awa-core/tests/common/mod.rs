//! Shared test support: every test gets its own database, dropped when the test ends.
#![allow(dead_code)]

use sqlx::{Connection, Executor, PgConnection, PgPool};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

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
    pub pool: PgPool,
}

impl TestDb {
    /// A new, migrated database.
    pub async fn new() -> TestDb {
        let db = TestDb::empty().await;
        awa_core::migrate(&db.pool).await.expect("migrate");
        db
    }

    /// A new database without the awa schema.
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
            .expect("connect");
        TestDb { name, url, pool }
    }

    pub async fn pool(&self, max: u32) -> PgPool {
        awa_core::pool_options()
            .max_connections(max)
            .connect(&self.url)
            .await
            .expect("connect")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime, which is blocked here: do the cleanup on a
        // thread of its own, and let DROP ... WITH (FORCE) end the pool's connections (closing
        // the pool would wait on the blocked runtime).
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(mut admin) = PgConnection::connect(&base_url()).await {
                        let _ = admin
                            .execute(
                                format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str(),
                            )
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

//! Installing queue storage and moving a live database from canonical to it (issue 18;
//! migration 12; docs/storage-transition.md).
//!
//! The state is one row, `awa.storage_transition_state`, changed only by migration 12's SQL
//! functions (`awa.storage_prepare`, `storage_enter_mixed_transition`, `storage_finalize`,
//! `storage_abort`), which check their own preconditions under the row's lock; this module
//! calls them, installs the substrate, reads the status operators see, and decides which
//! engine a starting runtime works ([`runtime_engine`]).
//!
//! A runtime's engine is decided once, at start, from its [`TransitionRole`] and the state:
//! `auto` works canonical in `canonical`/`prepared` and queue storage in
//! `mixed_transition`/`active`; `canonical_drain` always works canonical (it drains the old
//! engine during a transition); `queue_storage_target` always works queue storage (a
//! transition cannot enter its mixed phase until one is live). Producers follow the state
//! within a second ([`crate::storage::routing`]).

use crate::error::{AwaError, Result};
use crate::storage::engine::Engine;
use crate::storage::pool::Db;
use crate::storage::queue_storage::QueueStorage;
use serde_json::{json, Value};
use std::sync::Arc;

/// How a runtime takes part in a storage transition (awa-pg's `storage_transition_role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransitionRole {
    #[default]
    Auto,
    CanonicalDrain,
    QueueStorageTarget,
}

impl TransitionRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionRole::Auto => "auto",
            TransitionRole::CanonicalDrain => "canonical_drain",
            TransitionRole::QueueStorageTarget => "queue_storage_target",
        }
    }

    /// Parse awa-pg's names; the error is awa-pg's message.
    pub fn parse(s: &str) -> Result<TransitionRole> {
        match s {
            "auto" => Ok(TransitionRole::Auto),
            "canonical_drain" => Ok(TransitionRole::CanonicalDrain),
            "queue_storage_target" => Ok(TransitionRole::QueueStorageTarget),
            other => Err(AwaError::InvalidStorage(format!(
                "storage_transition_role must be one of 'auto', 'canonical_drain', or \
                 'queue_storage_target' (got '{other}')"
            ))),
        }
    }
}

/// What a runtime records as its `storage_capability` in `awa.runtime_instances`:
/// `queue_storage` when it works queue storage, `canonical_drain_only` when it works canonical
/// (and so can be left to drain it while new writes go to queue storage). `canonical`, the
/// column's default, marks a runtime that knows nothing of transitions (a client built before
/// migration 12): those block a transition's mixed phase and its finalize.
pub fn capability(engine: &Engine) -> &'static str {
    match engine {
        Engine::Canonical => "canonical_drain_only",
        Engine::QueueStorage(_) => "queue_storage",
    }
}

/// awa-pg's checks of a queue-storage schema name and ring sizes, with its messages, then
/// ours (a plain lower-case identifier; at most 256 slots per ring).
pub fn queue_storage(schema: &str, queue_slots: u32, lease_slots: u32) -> Result<QueueStorage> {
    let identifier = !schema.is_empty()
        && schema.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        return Err(AwaError::InvalidStorage(format!(
            "invalid SQL identifier: {schema}"
        )));
    }
    if queue_slots < 4 {
        return Err(AwaError::InvalidStorage(
            "queue storage requires at least 4 queue slots".into(),
        ));
    }
    if lease_slots < 2 {
        return Err(AwaError::InvalidStorage(
            "queue storage requires at least 2 lease slots".into(),
        ));
    }
    QueueStorage::new(schema, queue_slots, lease_slots).map_err(|e| match e {
        AwaError::Config(m) => AwaError::InvalidStorage(m),
        other => other,
    })
}

/// Install queue storage and make it the engine of every new job at once (awa-pg's
/// `install_queue_storage`, for fresh databases and tests; a database with live canonical
/// jobs moves with the transition instead, so that none is left behind). Installing where it
/// is installed changes nothing; `reset` first drops the schema's queue-storage objects and
/// everything in them (only those: canonical's tables in the same schema are kept).
pub async fn install_queue_storage(db: &Db, qs: &QueueStorage, reset: bool) -> Result<()> {
    let mut tx = db.begin().await?;
    let (state, current, schema): (String, String, Option<String>) = sqlx::query_as(
        "SELECT state, current_engine, details ->> 'schema'
         FROM awa.storage_transition_state FOR UPDATE",
    )
    .fetch_one(&mut *tx)
    .await?;
    if state == "mixed_transition" {
        return Err(AwaError::Storage(
            "cannot install queue storage during a mixed transition; finalize or abort it first"
                .into(),
        ));
    }
    let backlog: i64 = sqlx::query_scalar("SELECT awa.canonical_live_backlog()")
        .fetch_one(&mut *tx)
        .await?;
    if backlog > 0 {
        return Err(AwaError::Storage(format!(
            "cannot install queue storage while canonical live backlog is {backlog}; move a \
             database with live jobs with the storage transition (prepare, \
             enter-mixed-transition, finalize; docs/storage-transition.md)"
        )));
    }
    let same =
        state == "active" && current == "queue_storage" && schema.as_deref() == Some(qs.schema());
    if state == "active" && !same {
        if let Some(old) = schema.as_deref() {
            let live: i64 = sqlx::query_scalar(&format!("SELECT {old}.qs_jobs_live()"))
                .fetch_one(&mut *tx)
                .await?;
            if live > 0 {
                return Err(AwaError::Storage(format!(
                    "cannot install queue storage in schema \"{}\" while schema \"{old}\" \
                     holds {live} live job(s)",
                    qs.schema()
                )));
            }
        }
    }
    if reset {
        // awa.jobs may read this schema's qs_jobs: point it away first (the state update
        // below points it back).
        sqlx::query("SELECT awa.refresh_jobs_view($1)")
            .bind(qs.schema())
            .execute(&mut *tx)
            .await?;
        let sql = uninstall_sql(qs.schema());
        sqlx::Executor::execute(&mut *tx, sql.as_str()).await?;
    }
    qs.install_in(&mut tx).await?;
    sqlx::query(
        "UPDATE awa.storage_transition_state
         SET current_engine = 'queue_storage', prepared_engine = NULL, state = 'active',
             details = jsonb_build_object('schema', $1::text),
             transition_epoch = transition_epoch + CASE WHEN $2 THEN 0 ELSE 1 END,
             entered_at = CASE WHEN $2 THEN entered_at ELSE now() END, updated_at = now(),
             finalized_at = CASE WHEN $2 THEN finalized_at ELSE now() END",
    )
    .bind(qs.schema())
    .bind(same)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO awa.runtime_storage_backends (backend, schema_name)
         VALUES ('queue_storage', $1)
         ON CONFLICT (backend) DO UPDATE SET schema_name = excluded.schema_name, updated_at = now()",
    )
    .bind(qs.schema())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    crate::storage::routing::forget(db);
    Ok(())
}

/// Install the substrate without routing anything to it (awa-pg's
/// `prepare_queue_storage_schema`): the first step of a live transition.
pub async fn prepare_queue_storage_schema(db: &Db, qs: &QueueStorage) -> Result<()> {
    let mut tx = db.begin().await?;
    qs.install_in(&mut tx).await?;
    // `awa.jobs` shows the schema once it is the readable one (a prepared transition names it).
    sqlx::query("SELECT awa.refresh_jobs_view()")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Drop a schema's queue-storage objects (and the rows in them). The view goes with its
/// tables, the trigger with `ready_entries`; the functions are dropped by name.
fn uninstall_sql(schema: &str) -> String {
    let mut sql = String::new();
    for table in QueueStorage::tables() {
        sql.push_str(&format!("DROP TABLE IF EXISTS {schema}.{table} CASCADE;\n"));
    }
    sql.push_str(&format!("DROP SEQUENCE IF EXISTS {schema}.qs_seq;\n"));
    sql.push_str(&crate::storage::queue_storage::drop_functions_sql(
        schema, true,
    ));
    for ty in QueueStorage::types() {
        sql.push_str(&format!("DROP TYPE IF EXISTS {schema}.{ty} CASCADE;\n"));
    }
    sql
}

/// A transition step: `prepare` (with the schema), `enter_mixed_transition`, `finalize` or
/// `abort`. Returns the state after it (the row of `awa.storage_status()`, as JSON).
pub async fn step(db: &Db, action: &str, schema: Option<&str>) -> Result<Value> {
    let row = match action {
        "prepare" => {
            let schema = schema.unwrap_or("awa");
            queue_storage(schema, 16, 8)?;
            sqlx::query(&format!(
                "SELECT {STATUS_JSON} FROM awa.storage_prepare('queue_storage', \
                 jsonb_build_object('schema', $1::text)) s"
            ))
            .bind(schema)
            .fetch_one(db)
            .await?
        }
        "enter_mixed_transition" | "finalize" | "abort" => {
            sqlx::query(&format!(
                "SELECT {STATUS_JSON} FROM awa.storage_{action}() s"
            ))
            .fetch_one(db)
            .await?
        }
        other => {
            return Err(AwaError::InvalidStorage(format!(
                "unknown storage transition step {other:?} (expected prepare, \
                 enter_mixed_transition, finalize or abort)"
            )))
        }
    };
    crate::storage::routing::forget(db);
    use sqlx::Row;
    Ok(row.try_get::<Value, _>(0)?)
}

/// The status row as one JSON object (timestamps as text).
const STATUS_JSON: &str = "jsonb_build_object(
    'current_engine', s.current_engine, 'active_engine', s.active_engine,
    'prepared_engine', s.prepared_engine, 'state', s.state,
    'transition_epoch', s.transition_epoch, 'details', s.details,
    'entered_at', s.entered_at, 'updated_at', s.updated_at, 'finalized_at', s.finalized_at)";

/// What awa-pg's `storage_status()` reports: the state row, the canonical backlog, the
/// prepared schema and whether it is installed, live runtimes by capability, and whether each
/// next step may run now with what blocks it (the same checks the SQL functions make).
pub async fn status(db: &Db) -> Result<Value> {
    let mut tx = db.begin().await?;
    let row: Value =
        sqlx::query_scalar(&format!("SELECT {STATUS_JSON} FROM awa.storage_status() s"))
            .fetch_one(&mut *tx)
            .await?;
    let backlog: i64 = sqlx::query_scalar("SELECT awa.canonical_live_backlog()")
        .fetch_one(&mut *tx)
        .await?;
    let counts: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_object_agg(c, n), '{}'::jsonb) FROM (
             SELECT storage_capability AS c, count(*) AS n FROM awa.runtime_instances r
             WHERE awa.storage_runtime_live(r) GROUP BY 1) t",
    )
    .fetch_one(&mut *tx)
    .await?;
    let targets: i64 = sqlx::query_scalar(
        "SELECT awa.storage_live_runtimes('queue_storage', 'queue_storage_target')",
    )
    .fetch_one(&mut *tx)
    .await?;
    let state = row["state"].as_str().unwrap_or_default().to_string();
    let prepared_engine = row["prepared_engine"].as_str().map(str::to_string);
    let schema = (prepared_engine.as_deref() == Some("queue_storage")
        || row["current_engine"] == "queue_storage")
        .then(|| {
            row["details"]["schema"]
                .as_str()
                .unwrap_or("awa")
                .to_string()
        });
    let ready = match &schema {
        Some(s) => {
            let found: Option<String> = sqlx::query_scalar(
                "SELECT to_regprocedure(format('%I.qs_jobs_live()', $1::text))::text",
            )
            .bind(s)
            .fetch_one(&mut *tx)
            .await?;
            found.is_some()
        }
        None => false,
    };
    tx.commit().await?;
    let canonical_only = counts["canonical"].as_i64().unwrap_or(0);
    let mut enter = Vec::new();
    if state != "prepared" {
        enter.push(format!("state is '{state}' (expected 'prepared')"));
    }
    if prepared_engine.as_deref() != Some("queue_storage") {
        enter.push(format!(
            "prepared_engine is {} (expected Some(\"queue_storage\"))",
            prepared_engine
                .as_deref()
                .map_or("None".to_string(), |e| format!("Some(\"{e}\")"))
        ));
    }
    if !ready {
        enter.push("prepared queue-storage schema is missing required tables".into());
    }
    if canonical_only > 0 {
        enter.push(format!(
            "{canonical_only} canonical-only runtime(s) are still live"
        ));
    }
    if targets == 0 {
        enter.push(
            "no live runtimes with transition_role=queue_storage_target are reporting; start \
             one before entering the mixed transition"
                .into(),
        );
    }
    let mut finalize = Vec::new();
    if state != "mixed_transition" {
        finalize.push(format!("state is '{state}' (expected 'mixed_transition')"));
    }
    if backlog > 0 {
        finalize.push(format!("canonical live backlog is {backlog}"));
    }
    if canonical_only > 0 {
        finalize.push(format!(
            "{canonical_only} canonical-only runtime(s) are still live"
        ));
    }
    let mut out = row;
    if let Value::Object(map) = &mut out {
        map.insert("canonical_live_backlog".into(), json!(backlog));
        map.insert("prepared_queue_storage_schema".into(), json!(schema));
        map.insert("prepared_schema_ready".into(), json!(ready));
        map.insert("live_runtime_capability_counts".into(), counts);
        map.insert("can_enter_mixed_transition".into(), json!(enter.is_empty()));
        map.insert("enter_mixed_transition_blockers".into(), json!(enter));
        map.insert("can_finalize".into(), json!(finalize.is_empty()));
        map.insert("finalize_blockers".into(), json!(finalize));
    }
    Ok(out)
}

/// The engine a starting runtime works, from its role and the state (see the module doc).
/// `requested` is the queue-storage schema the runtime was configured with, if any; it must
/// match the state's. A `queue_storage_target` runtime installs the schema if it is missing
/// (with `slots`), so that a transition can be prepared and its target started in either
/// order.
pub async fn runtime_engine(
    db: &Db,
    role: TransitionRole,
    requested: Option<&str>,
    slots: (u32, u32),
) -> Result<Engine> {
    let (state, current, prepared, schema): (String, String, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT state, current_engine, prepared_engine, details ->> 'schema'
             FROM awa.storage_transition_state",
        )
        .fetch_one(db)
        .await?;
    let qs_in_play = current == "queue_storage" || prepared.as_deref() == Some("queue_storage");
    let state_schema = schema.unwrap_or_else(|| "awa".to_string());
    if let Some(r) = requested {
        if qs_in_play && r != state_schema {
            return Err(AwaError::InvalidStorage(format!(
                "queue storage runtime configured for schema '{r}' but transition state \
                 requires '{state_schema}'"
            )));
        }
    }
    let use_qs = match role {
        TransitionRole::CanonicalDrain => false,
        TransitionRole::Auto => matches!(state.as_str(), "mixed_transition" | "active"),
        TransitionRole::QueueStorageTarget => {
            if !qs_in_play {
                return Err(AwaError::Storage(
                    "storage_transition_role='queue_storage_target' needs queue storage \
                     prepared (awa.storage_prepare / `awa storage prepare`) or installed \
                     (install_queue_storage)"
                        .into(),
                ));
            }
            true
        }
    };
    if !use_qs {
        return Ok(Engine::Canonical);
    }
    let qs = queue_storage(&state_schema, slots.0, slots.1)?;
    if !qs.installed(db).await? {
        if role == TransitionRole::QueueStorageTarget {
            prepare_queue_storage_schema(db, &qs).await?;
        } else {
            return Err(AwaError::Storage(format!(
                "queue storage schema \"{state_schema}\" is not prepared"
            )));
        }
    }
    Ok(Engine::QueueStorage(Arc::new(qs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_drops_every_table_the_install_script_creates() {
        let tables = QueueStorage::tables();
        for name in [
            "queue_ring_state",
            "ready_entries",
            "leases",
            "deferred_jobs",
            "unique_keys",
            "qs_substrate",
        ] {
            assert!(tables.contains(&name), "{name} missing from {tables:?}");
        }
        let sql = uninstall_sql("awa_x");
        assert_eq!(
            sql.matches("DROP TABLE IF EXISTS awa_x.").count(),
            tables.len()
        );
        assert_eq!(QueueStorage::types(), ["qs_claimed_job"]);
        assert!(sql.contains("DROP TYPE IF EXISTS awa_x.qs_claimed_job CASCADE;"));
    }

    #[test]
    fn names_and_sizes_are_refused_with_awa_pgs_messages() {
        let message = |r: Result<QueueStorage>| match r {
            Err(AwaError::InvalidStorage(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(queue_storage("Bad-Name", 16, 8)),
            "invalid SQL identifier: Bad-Name"
        );
        assert_eq!(
            message(queue_storage("awa", 3, 8)),
            "queue storage requires at least 4 queue slots"
        );
        assert_eq!(
            message(queue_storage("awa", 16, 1)),
            "queue storage requires at least 2 lease slots"
        );
        assert!(message(queue_storage("Awa", 16, 8)).contains("lower-case identifier"));
        assert!(message(queue_storage("awa", 257, 8)).contains("queue_slot_count is 257"));
        assert_eq!(
            TransitionRole::parse("canonical_drain").ok(),
            Some(TransitionRole::CanonicalDrain)
        );
        assert!(TransitionRole::parse("bogus").is_err());
    }
}

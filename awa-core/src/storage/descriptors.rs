//! Queue and job-kind descriptors (`awa.queue_descriptors`, `awa.job_kind_descriptors`,
//! migration 11): what a queue or kind is for, who owns it and where its runbook is, so an
//! operator reading the web UI need not read the worker's source. awa-pg 0.6.9's
//! `queue_descriptor(...)` / `job_kind_descriptor(...)` declare them; this module checks them
//! and keeps the catalogue.
//!
//! Life of a row: a client writes one row for every queue it works and every kind it
//! handles or declares when it starts ([`sync`], from `Client::start`), and again on each
//! runtime-registry refresh (`executor::registry`), which moves `last_seen_at`; `updated_at`
//! moves only when the content (its hash) changes. The maintenance leader deletes rows nobody
//! refreshed for `descriptor_retention_days` ([`prune_stale`]), so a queue that was renamed
//! away leaves the catalogue by itself.
//!
//! A client that works a queue without declaring its descriptor inserts a bare row when there
//! is none and otherwise only refreshes `last_seen_at`: it never erases what another client
//! declared (awa-pg overwrites with the empty descriptor; see docs/operating.md).

use crate::error::{AwaError, Result};
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest queue or kind name, display name and owner, in characters (awa-pg's limits).
pub const MAX_NAME_CHARS: usize = 200;
/// Longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 2000;
/// Longest docs URL, in characters.
pub const MAX_DOCS_URL_CHARS: usize = 2048;
/// Most tags of one descriptor.
pub const MAX_TAGS: usize = 20;

/// A row is shown as stale after this many of its writer's refresh intervals without a
/// refresh (no live client declares it any more), as the runtime registry does.
const STALE_INTERVALS: i64 = 10;

/// Which catalogue: the table, its key column and what the error messages call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Queue,
    JobKind,
}

impl Subject {
    fn table(self) -> &'static str {
        match self {
            Subject::Queue => "awa.queue_descriptors",
            Subject::JobKind => "awa.job_kind_descriptors",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Subject::Queue => "queue",
            Subject::JobKind => "kind",
        }
    }
    fn hashes_column(self) -> &'static str {
        match self {
            Subject::Queue => "queue_descriptor_hashes",
            Subject::JobKind => "job_kind_descriptor_hashes",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Subject::Queue => "queue descriptor",
            Subject::JobKind => "job kind descriptor",
        }
    }
}

/// What one declaration says. Every field is optional; `extra` is any JSON (awa-pg stores
/// what it is given), an object by default.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub docs_url: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default = "empty_object")]
    pub extra: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

impl Default for Descriptor {
    fn default() -> Self {
        Descriptor {
            display_name: None,
            description: None,
            owner: None,
            docs_url: None,
            tags: Vec::new(),
            extra: empty_object(),
        }
    }
}

impl Descriptor {
    /// Check the declaration of `name` against the tables' limits (the same as awa-pg's
    /// CHECK constraints) and for NUL bytes, which PostgreSQL cannot store. The error is
    /// `AwaError::Config` (Python's `awa.ConfigError`, a `ValidationError` and `ValueError`)
    /// naming the descriptor and the field, raised before anything is written; awa-pg
    /// only finds these when `start()` hits the constraint.
    pub fn validate(&self, subject: Subject, name: &str) -> Result<()> {
        let fail = |what: String| AwaError::Config(format!("{} {name:?}: {what}", subject.label()));
        let text = |field: &str, value: &str, limit: usize| -> Result<()> {
            let len = value.chars().count();
            if len > limit {
                return Err(fail(format!(
                    "{field} is {len} characters; the limit is {limit}"
                )));
            }
            if value.contains('\0') {
                return Err(fail(format!(
                    "{field} contains a NUL byte, which PostgreSQL cannot store"
                )));
            }
            Ok(())
        };
        if name.is_empty() {
            return Err(AwaError::Config(format!(
                "{} name must not be empty",
                subject.label()
            )));
        }
        text(subject.key(), name, MAX_NAME_CHARS)?;
        let fields = [
            ("display_name", &self.display_name, MAX_NAME_CHARS),
            ("description", &self.description, MAX_DESCRIPTION_CHARS),
            ("owner", &self.owner, MAX_NAME_CHARS),
            ("docs_url", &self.docs_url, MAX_DOCS_URL_CHARS),
        ];
        for (field, value, limit) in fields {
            if let Some(v) = value {
                text(field, v, limit)?;
            }
        }
        if self.tags.len() > MAX_TAGS {
            return Err(fail(format!(
                "tags has {} entries; the limit is {MAX_TAGS}",
                self.tags.len()
            )));
        }
        for tag in &self.tags {
            text("tags", tag, MAX_DESCRIPTION_CHARS)?;
        }
        crate::model::validate::check_json("extra", &self.extra).map_err(|e| fail(e.to_string()))
    }

    /// The content hash: hex BLAKE3 of the descriptor's JSON (fields in declaration order,
    /// `extra`'s keys sorted by serde_json's map), so equal declarations hash equal on every
    /// client and a change moves `updated_at`.
    pub fn hash(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        blake3::hash(&bytes).to_hex().to_string()
    }
}

/// Everything one client writes: its queues' and kinds' descriptors, `None` where it works
/// the queue or handles the kind without declaring one.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    pub queues: BTreeMap<String, Option<Descriptor>>,
    pub kinds: BTreeMap<String, Option<Descriptor>>,
}

impl Catalogue {
    fn entries(&self, subject: Subject) -> &BTreeMap<String, Option<Descriptor>> {
        match subject {
            Subject::Queue => &self.queues,
            Subject::JobKind => &self.kinds,
        }
    }

    /// `{name: hash}` of the declared descriptors, for the runtime registry's row: the API
    /// flags a name two live clients declare differently.
    pub fn declared_hashes(&self, subject: Subject) -> Value {
        Value::Object(
            self.entries(subject)
                .iter()
                .filter_map(|(name, d)| d.as_ref().map(|d| (name.clone(), Value::from(d.hash()))))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty() && self.kinds.is_empty()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Write (or refresh) the catalogue's rows, one statement per table and kind of entry, in
/// name order so two clients writing the same names cannot deadlock. `interval` is how often
/// this client refreshes (the staleness rule reads it).
pub(crate) async fn sync(pool: &Db, catalogue: &Catalogue, interval: Duration) -> Result<()> {
    for subject in [Subject::Queue, Subject::JobKind] {
        let mut declared = Vec::new();
        let mut bare = Vec::new();
        for (name, d) in catalogue.entries(subject) {
            let (d, list) = match d {
                Some(d) => (d.clone(), &mut declared),
                None => (Descriptor::default(), &mut bare),
            };
            let hash = d.hash();
            list.push(serde_json::json!({
                "name": name, "display_name": d.display_name, "description": d.description,
                "owner": d.owner, "docs_url": d.docs_url, "tags": d.tags, "extra": d.extra,
                "hash": hash,
            }));
        }
        let (table, key) = (subject.table(), subject.key());
        let insert = format!(
            "INSERT INTO {table} AS d ({key}, display_name, description, owner, docs_url, tags,
                                     extra, descriptor_hash, sync_interval_ms)
             SELECT e.name, e.display_name, e.description, e.owner, e.docs_url,
                    ARRAY(SELECT jsonb_array_elements_text(e.tags)), e.extra, e.hash, $2
             FROM jsonb_to_recordset($1) AS e(name text, display_name text, description text,
                  owner text, docs_url text, tags jsonb, extra jsonb, hash text)
             ORDER BY e.name"
        );
        if !declared.is_empty() {
            sqlx::query(&format!(
                "{insert} ON CONFLICT ({key}) DO UPDATE SET
                     display_name = excluded.display_name, description = excluded.description,
                     owner = excluded.owner, docs_url = excluded.docs_url, tags = excluded.tags,
                     extra = excluded.extra, descriptor_hash = excluded.descriptor_hash,
                     sync_interval_ms = excluded.sync_interval_ms, last_seen_at = now(),
                     updated_at = CASE WHEN d.descriptor_hash = excluded.descriptor_hash
                                       THEN d.updated_at ELSE now() END"
            ))
            .bind(Value::Array(declared))
            .bind(millis(interval))
            .execute(pool)
            .await?;
        }
        if !bare.is_empty() {
            sqlx::query(&format!(
                "{insert} ON CONFLICT ({key}) DO UPDATE SET
                     sync_interval_ms = excluded.sync_interval_ms, last_seen_at = now()"
            ))
            .bind(Value::Array(bare))
            .bind(millis(interval))
            .execute(pool)
            .await?;
        }
    }
    Ok(())
}

/// Delete rows not refreshed for `retention` (descriptor_retention_days); returns how many.
pub async fn prune_stale(pool: &Db, retention: Duration) -> Result<u64> {
    let mut deleted = 0;
    for subject in [Subject::Queue, Subject::JobKind] {
        let done = sqlx::query(&format!(
            "DELETE FROM {} WHERE last_seen_at < now() - make_interval(secs => $1)",
            subject.table()
        ))
        .bind(retention.as_secs_f64())
        .execute(pool)
        .await?;
        deleted += done.rows_affected();
    }
    Ok(deleted)
}

/// One catalogue row as the API shows it (the field names of awa-pg's admin API).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DescriptorRow {
    /// The queue or kind.
    pub name: String,
    pub display_name: Option<String>,
    pub description: Option<String>,
    pub owner: Option<String>,
    pub docs_url: Option<String>,
    pub tags: Vec<String>,
    pub extra: Value,
    pub descriptor_hash: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub descriptor_last_seen_at: DateTime<Utc>,
    /// Not refreshed for ten of its writer's intervals (and a minute): no live client
    /// declares it; retention will delete it.
    pub descriptor_stale: bool,
    /// Live clients (fresh rows of `awa.runtime_instances`) declare it with different
    /// content; the row holds whichever wrote last.
    pub descriptor_mismatch: bool,
}

/// Every row of one catalogue, by name.
pub async fn list(pool: &Db, subject: Subject) -> Result<Vec<DescriptorRow>> {
    use sqlx::Row;
    let (table, key, hashes) = (subject.table(), subject.key(), subject.hashes_column());
    let live = crate::storage::runtime_instances::LIVE_SQL;
    let rows = sqlx::query(&format!(
        "SELECT d.{key} AS name, d.display_name, d.description, d.owner, d.docs_url, d.tags,
                d.extra, d.descriptor_hash, d.created_at, d.updated_at, d.last_seen_at,
                d.last_seen_at < now() - greatest(interval '1 minute',
                    make_interval(secs => d.sync_interval_ms * $1 / 1000.0)) AS stale,
                (SELECT count(DISTINCT r.{hashes} ->> d.{key}) > 1
                 FROM awa.runtime_instances r
                 WHERE r.{hashes} ? d.{key} AND {live}) AS mismatch
         FROM {table} d ORDER BY d.{key}"
    ))
    .bind(STALE_INTERVALS)
    .bind(crate::storage::runtime_instances::MIN_STALE.as_secs_f64())
    .bind(crate::storage::runtime_instances::STALE_INTERVALS)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(DescriptorRow {
                name: row.try_get("name")?,
                display_name: row.try_get("display_name")?,
                description: row.try_get("description")?,
                owner: row.try_get("owner")?,
                docs_url: row.try_get("docs_url")?,
                tags: row.try_get("tags")?,
                extra: row.try_get("extra")?,
                descriptor_hash: row.try_get("descriptor_hash")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
                descriptor_last_seen_at: row.try_get("last_seen_at")?,
                descriptor_stale: row.try_get("stale")?,
                descriptor_mismatch: row.try_get("mismatch")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_messages() {
        let ok = Descriptor {
            display_name: Some("d".repeat(200)),
            tags: vec!["t".into(); 20],
            ..Descriptor::default()
        };
        assert!(ok.validate(Subject::Queue, "email").is_ok());
        let long = Descriptor {
            display_name: Some("d".repeat(201)),
            ..Descriptor::default()
        };
        let err = long
            .validate(Subject::Queue, "email")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("queue descriptor \"email\": display_name is 201 characters; the limit is 200")
        );
        assert!(Descriptor::default()
            .validate(Subject::JobKind, "")
            .is_err());
        let nul = Descriptor {
            owner: Some("a\0b".into()),
            ..Descriptor::default()
        };
        assert!(nul.validate(Subject::JobKind, "k").is_err());
    }

    #[test]
    fn hash_follows_content() {
        let a = Descriptor::default();
        let b = Descriptor {
            owner: Some("x".into()),
            ..Descriptor::default()
        };
        assert_eq!(a.hash(), Descriptor::default().hash());
        assert_ne!(a.hash(), b.hash());
    }
}

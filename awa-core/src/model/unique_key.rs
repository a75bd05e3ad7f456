//! The unique key: the bytes the deduplication index compares (docs/unique-keys.md).
//!
//! The layout is awa's (its ADR-002), so a key computed here equals the one awa-pg 0.6.9
//! computes for the same parts, byte for byte:
//!
//! ```text
//! BLAKE3( kind
//!         [ 0x00 queue                        ]   by_queue
//!         [ 0x00 compact key-sorted JSON args ]   by_args
//!         [ 0x00 period bucket, i64 LE        ] ) by_period
//! truncated to its first 16 bytes
//! ```
//!
//! `unique_states` is not part of the key (awa-pg stores it beside the key, and so do we): two
//! jobs with the same parts and different state masks share a key.
//!
//! The known-answer vectors in `unique_key_vectors.json` were produced by awa-pg itself
//! (`bench/compat/unique_key_vectors.py` regenerates them); the tests below recompute each one.

use chrono::{DateTime, Utc};
use serde_json::Value;

/// Bytes kept from the BLAKE3 digest: 128 bits, as awa stores them.
pub const KEY_LEN: usize = 16;

/// The parts a key is built from; `None` leaves a part out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyParts<'a> {
    pub kind: &'a str,
    pub queue: Option<&'a str>,
    pub args: Option<&'a Value>,
    pub period_bucket: Option<i64>,
}

/// The key for exactly the parts given (what `cancel_by_unique_key` rebuilds).
pub fn compute(parts: KeyParts<'_>) -> Vec<u8> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(parts.kind.as_bytes());
    if let Some(queue) = parts.queue {
        hasher.update(&[0]);
        hasher.update(queue.as_bytes());
    }
    if let Some(args) = parts.args {
        hasher.update(&[0]);
        hasher.update(&canonical_json(args));
    }
    if let Some(bucket) = parts.period_bucket {
        hasher.update(&[0]);
        hasher.update(&bucket.to_le_bytes());
    }
    hasher.finalize().as_bytes()[..KEY_LEN].to_vec()
}

/// The period bucket a job falls in: whole `period`s since the Unix epoch of its `run_at`, or
/// of now for a job that runs now. `period` is validated positive before this is called.
pub fn period_bucket(period: i64, run_at: Option<DateTime<Utc>>) -> i64 {
    run_at
        .unwrap_or_else(Utc::now)
        .timestamp()
        .div_euclid(period.max(1))
}

/// Compact JSON with every object's keys in byte order, at every depth: what awa hashes for
/// `by_args`. Written by hand rather than by `serde_json::to_vec`, whose key order follows
/// the map type and would silently change if any crate in the build enabled serde_json's
/// `preserve_order`. Strings and numbers are formatted by serde_json (shortest round-trip
/// floats, `1.0` for a whole float, non-ASCII characters as raw UTF-8), as awa's are.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

/// A string, number, bool or null, as serde_json writes it (as awa-pg 0.6.9's does: `1.0`,
/// `1e+20`, `1e-7`, shortest round-trip digits). A serde_json release that changed its float
/// format would change keys; the awa-pg vectors in the tests catch that. Writing a scalar into
/// a `Vec` cannot fail (no I/O), so the error arm is unreachable in practice; it writes
/// `null` rather than panic.
fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Deserialize)]
    struct Vectors {
        awa_pg_version: String,
        facts: Facts,
        vectors: Vec<Vector>,
    }

    #[derive(serde::Deserialize)]
    struct Facts {
        states_change_key: bool,
        cancel_by_unique_key_period_bucket_3600_finds_by_period_3600_job: bool,
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        name: String,
        kind: String,
        queue: String,
        args: String,
        by_queue: bool,
        by_args: bool,
        by_period: Option<i64>,
        awa_pg_args: String,
        awa_pg_key: String,
        differs: Option<String>,
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn vectors() -> Vectors {
        serde_json::from_str(include_str!("unique_key_vectors.json")).expect("vectors parse")
    }

    fn key_of(v: &Vector, args_json: &str) -> String {
        let args: Value = serde_json::from_str(args_json).expect("vector args parse");
        hex(&compute(KeyParts {
            kind: &v.kind,
            queue: v.by_queue.then_some(v.queue.as_str()),
            args: v.by_args.then_some(&args),
            period_bucket: v.by_period,
        }))
    }

    /// Every key awa-pg 0.6.9 stored equals ours for the same parts. awa-pg hashes the
    /// `by_period` value itself where the bucket goes, so its `by_period = P` job is our key
    /// with `period_bucket = P`: the layout is the same, the value put there differs (see
    /// docs/unique-keys.md). A vector marked `differs` is a documented difference in the
    /// *input* (awa-pg hashes the args as it converted them, `awa_pg_args`, which is also what
    /// it stored): our key of awa-pg's converted args is awa-pg's key, our key of the caller's
    /// args is not. (`awa_pg_args` is read back through jsonb, which turns `-0.0` into `0.0`,
    /// so only the `differs` vectors are checked against it.)
    #[test]
    fn matches_awa_pg_vectors() {
        let doc = vectors();
        assert_eq!(doc.awa_pg_version, "0.6.9");
        assert!(doc.vectors.len() >= 15);
        for v in &doc.vectors {
            match &v.differs {
                None => assert_eq!(key_of(v, &v.args), v.awa_pg_key, "vector {}", v.name),
                Some(_) => {
                    assert_eq!(key_of(v, &v.awa_pg_args), v.awa_pg_key, "vector {}", v.name);
                    assert_ne!(key_of(v, &v.args), v.awa_pg_key, "vector {}", v.name);
                }
            }
        }
        let names: Vec<&str> = doc.vectors.iter().map(|v| v.name.as_str()).collect();
        for needed in [
            "kind_only",
            "by_queue",
            "by_args_nested",
            "by_args_key_order",
            "by_args_unicode",
            "by_args_large_ints",
            "by_args_beyond_u64",
            "by_args_u64_above_i64",
            "by_args_floats",
            "by_period_3600",
            "all_parts",
        ] {
            assert!(names.contains(&needed), "missing vector {needed}");
        }
    }

    #[test]
    fn states_are_not_part_of_the_key_in_awa_pg() {
        let facts = vectors().facts;
        assert!(!facts.states_change_key);
        assert!(facts.cancel_by_unique_key_period_bucket_3600_finds_by_period_3600_job);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_is_compact() {
        let v = json!({"b": {"z": 1, "a": [true, null, {"y": 1.0, "x": "é"}]}, "a": -0.5});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            r#"{"a":-0.5,"b":{"a":[true,null,{"x":"é","y":1.0}],"z":1}}"#
        );
        // Byte order, not code-point-insensitive or length-first (jsonb's storage order).
        let v = json!({"aa": 1, "b": 2, "B": 3, "é": 4});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            r#"{"B":3,"aa":1,"b":2,"é":4}"#
        );
    }

    #[test]
    fn each_part_changes_the_key() {
        let args = json!({"a": 1});
        let base = KeyParts {
            kind: "k",
            queue: None,
            args: None,
            period_bucket: None,
        };
        let keys = [
            compute(base),
            compute(KeyParts {
                queue: Some("q"),
                ..base
            }),
            compute(KeyParts {
                args: Some(&args),
                ..base
            }),
            compute(KeyParts {
                period_bucket: Some(1),
                ..base
            }),
            compute(KeyParts { kind: "k2", ..base }),
        ];
        for (i, a) in keys.iter().enumerate() {
            assert_eq!(a.len(), KEY_LEN);
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn period_bucket_floors_toward_negative_infinity() {
        use chrono::TimeZone;
        let at = |s| Utc.timestamp_opt(s, 0).single();
        assert_eq!(period_bucket(3600, at(7199)), 1);
        assert_eq!(period_bucket(3600, at(7200)), 2);
        assert_eq!(period_bucket(3600, at(-1)), -1);
    }
}

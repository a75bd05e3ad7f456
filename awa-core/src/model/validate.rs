//! The one validator every insert path shares: direct inserts, registered specs and staging.
//!
//! It checks every rule the database also enforces (CHECK constraints in the migration), so a
//! request that would be rejected fails here with a typed error naming the field, the value's
//! size and the limit — before any transaction opens, and in particular before a completion
//! transaction takes its locks.

use super::opts::{InsertOpts, UniqueOpts};
use chrono::{DateTime, Datelike, Utc};
use serde_json::Value;

pub const MAX_NAME_CHARS: usize = 200;
pub const MAX_TAGS: usize = 20;
pub const MIN_PRIORITY: i16 = 1;
pub const MAX_PRIORITY: i16 = 4;
pub const MAX_ATTEMPTS_LIMIT: i32 = 1000;
/// Deepest nesting of arrays and objects accepted in args and metadata (the document itself
/// is level 1). Well under `serde_json`'s parser limit of 128, so every request within it
/// parses, and deep enough for any real payload; past it the request is refused with
/// [`ValidationError::TooDeep`] instead of a recursion error somewhere later.
pub const MAX_JSON_DEPTH: usize = 64;

/// A rule an insert request broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{field} is {len} characters; the limit is {limit}")]
    TooLong {
        field: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("priority is {value}; it must be between 1 and 4")]
    Priority { value: i64 },
    #[error("max_attempts is {value}; it must be between 1 and 1000")]
    MaxAttempts { value: i64 },
    #[error("tags has {count} entries; the limit is {limit}")]
    TooManyTags { count: usize, limit: usize },
    #[error("{field} contains a NUL byte, which PostgreSQL cannot store")]
    NulByte { field: String },
    #[error("run_at year {year} is outside the supported years 1-9999")]
    RunAt { year: i32 },
    #[error("metadata must be a JSON object, got {got}")]
    MetadataNotObject { got: &'static str },
    #[error("unique by_period is {value}; it must be a positive number of seconds")]
    ByPeriod { value: i64 },
    #[error("unique states is {value}; it must be a bitmask between 1 and 255")]
    UniqueStates { value: i64 },
    #[error("invalid option {field}: {message}")]
    Option { field: String, message: String },
    #[error(
        "{path} nests deeper than {limit} levels of arrays and objects, the limit (MAX_JSON_DEPTH)"
    )]
    TooDeep { path: String, limit: usize },
}

/// A request that passed validation: exactly what one `awa.jobs` row insert needs.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub kind: String,
    pub queue: String,
    pub args: Value,
    pub priority: i16,
    pub max_attempts: i32,
    pub run_at: Option<DateTime<Utc>>,
    pub tags: Vec<String>,
    pub metadata: Value,
    pub unique_key: Option<Vec<u8>>,
    pub unique_states: Option<u8>,
    pub ordering_key: Option<String>,
}

impl NewJob {
    /// Bytes this request occupies when serialized: kind, queue, args, metadata, tags and
    /// ordering key. Staging limits are measured with this.
    pub fn serialized_size(&self) -> usize {
        self.kind.len()
            + self.queue.len()
            + json_len(&self.args)
            + json_len(&self.metadata)
            + self.tags.iter().map(String::len).sum::<usize>()
            + self.ordering_key.as_ref().map_or(0, String::len)
    }
}

fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(0)
}

fn check_name(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::Empty { field });
    }
    check_text(field, value)
}

/// A queue name as every insert checks it (not empty, at most 200 characters, no NUL), for
/// calls that take a queue outside an insert request (reviving a DLQ job into another queue).
pub(crate) fn check_queue(queue: &str) -> Result<(), ValidationError> {
    check_name("queue", queue)
}

fn check_text(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let len = value.chars().count();
    if len > MAX_NAME_CHARS {
        return Err(ValidationError::TooLong {
            field,
            len,
            limit: MAX_NAME_CHARS,
        });
    }
    if value.contains('\0') {
        return Err(ValidationError::NulByte {
            field: field.to_string(),
        });
    }
    Ok(())
}

/// Reject a NUL byte in any key or string value of a JSON document, and nesting deeper than
/// [`MAX_JSON_DEPTH`]. The path of the offending value (`args.items[3].n`) is built only on
/// the way out of a failure, so a valid document costs one walk and no allocation.
pub(crate) fn check_json(field: &str, v: &Value) -> Result<(), ValidationError> {
    let mut path = Vec::new();
    match walk_json(v, 1, &mut path) {
        Ok(()) => Ok(()),
        Err(problem) => {
            path.reverse();
            let mut at = field.to_string();
            for segment in path {
                at.push_str(&segment);
            }
            Err(match problem {
                JsonProblem::NulInKey => ValidationError::NulByte {
                    field: format!("{at} key"),
                },
                JsonProblem::NulInValue => ValidationError::NulByte { field: at },
                JsonProblem::TooDeep => ValidationError::TooDeep {
                    path: at,
                    limit: MAX_JSON_DEPTH,
                },
            })
        }
    }
}

enum JsonProblem {
    NulInKey,
    NulInValue,
    TooDeep,
}

/// Walk `v` at nesting level `depth`; on failure `path` holds the segments from the failing
/// value up to the root (innermost first).
fn walk_json(v: &Value, depth: usize, path: &mut Vec<String>) -> Result<(), JsonProblem> {
    match v {
        Value::String(s) if s.contains('\0') => Err(JsonProblem::NulInValue),
        Value::Array(_) | Value::Object(_) if depth > MAX_JSON_DEPTH => Err(JsonProblem::TooDeep),
        Value::Array(items) => items.iter().enumerate().try_for_each(|(i, item)| {
            walk_json(item, depth + 1, path).inspect_err(|_| path.push(format!("[{i}]")))
        }),
        Value::Object(map) => map.iter().try_for_each(|(k, val)| {
            let named = |path: &mut Vec<String>| path.push(key_segment(k));
            if k.contains('\0') {
                named(path);
                return Err(JsonProblem::NulInKey);
            }
            walk_json(val, depth + 1, path).inspect_err(|_| named(path))
        }),
        _ => Ok(()),
    }
}

/// `.name` for an identifier-like key, else `["the key"]`.
fn key_segment(key: &str) -> String {
    let plain = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_alphanumeric() || c == '_');
    if plain {
        format!(".{key}")
    } else {
        format!("[{}]", Value::from(key.replace('\0', "\\0")))
    }
}

/// A request or options document that did not parse. Nesting past serde_json's parser limit
/// (128 levels) is past [`MAX_JSON_DEPTH`] too and reads as that limit.
pub(crate) fn parse_error(field: &str, e: &serde_json::Error) -> ValidationError {
    let message = e.to_string();
    if message.starts_with("recursion limit exceeded") {
        return ValidationError::TooDeep {
            path: format!("a value in the {field}"),
            limit: MAX_JSON_DEPTH,
        };
    }
    ValidationError::Option {
        field: field.to_string(),
        message,
    }
}

/// How a JSON value's type reads in an error message ("a string", "an object", ...).
pub(crate) fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Validate an untyped request and compute its unique key.
pub fn validate(kind: &str, args: Value, opts: &InsertOpts) -> Result<NewJob, ValidationError> {
    check_name("kind", kind)?;
    check_name("queue", &opts.queue)?;
    if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&opts.priority) {
        return Err(ValidationError::Priority {
            value: opts.priority.into(),
        });
    }
    if !(1..=MAX_ATTEMPTS_LIMIT).contains(&opts.max_attempts) {
        return Err(ValidationError::MaxAttempts {
            value: opts.max_attempts.into(),
        });
    }
    if opts.tags.len() > MAX_TAGS {
        return Err(ValidationError::TooManyTags {
            count: opts.tags.len(),
            limit: MAX_TAGS,
        });
    }
    for tag in &opts.tags {
        check_name("tag", tag)?;
    }
    if let Some(key) = &opts.ordering_key {
        check_text("ordering_key", key)?;
    }
    if let Some(run_at) = opts.run_at {
        let year = run_at.year();
        if !(1..=9999).contains(&year) {
            return Err(ValidationError::RunAt { year });
        }
    }
    if !opts.metadata.is_object() {
        return Err(ValidationError::MetadataNotObject {
            got: json_type_name(&opts.metadata),
        });
    }
    check_json("args", &args)?;
    check_json("metadata", &opts.metadata)?;
    let (unique_key, unique_states) = match &opts.unique {
        Some(u) => {
            if let Some(p) = u.by_period {
                if p <= 0 {
                    return Err(ValidationError::ByPeriod { value: p });
                }
            }
            (
                Some(unique_key(kind, &opts.queue, &args, opts.run_at, u)),
                Some(u.states),
            )
        }
        None => (None, None),
    };
    Ok(NewJob {
        kind: kind.to_string(),
        queue: opts.queue.clone(),
        args,
        priority: opts.priority,
        max_attempts: opts.max_attempts,
        run_at: opts.run_at,
        tags: opts.tags.clone(),
        metadata: opts.metadata.clone(),
        unique_key,
        unique_states,
        ordering_key: opts.ordering_key.clone(),
    })
}

/// The key of a job with these unique options (docs/unique-keys.md): the parts `u` selects,
/// the period bucket taken from `run_at` or, for a job that runs now, from now.
pub fn unique_key(
    kind: &str,
    queue: &str,
    args: &Value,
    run_at: Option<DateTime<Utc>>,
    u: &UniqueOpts,
) -> Vec<u8> {
    super::unique_key::compute(super::unique_key::KeyParts {
        kind,
        queue: u.by_queue.then_some(queue),
        args: u.by_args.then_some(args),
        period_bucket: u
            .by_period
            .map(|p| super::unique_key::period_bucket(p, run_at)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn ok(opts: InsertOpts) -> bool {
        validate("k", json!({}), &opts).is_ok()
    }

    #[test]
    fn limits_at_and_past_the_edge() {
        let name = |n| "q".repeat(n);
        assert!(ok(InsertOpts {
            queue: name(200),
            ..Default::default()
        }));
        assert!(!ok(InsertOpts {
            queue: name(201),
            ..Default::default()
        }));
        assert!(validate(&"k".repeat(200), json!({}), &InsertOpts::default()).is_ok());
        assert_eq!(
            validate(&"k".repeat(201), json!({}), &InsertOpts::default()),
            Err(ValidationError::TooLong {
                field: "kind",
                len: 201,
                limit: 200
            })
        );
        for (p, good) in [(0, false), (1, true), (4, true), (5, false)] {
            assert_eq!(
                ok(InsertOpts {
                    priority: p,
                    ..Default::default()
                }),
                good,
                "priority {p}"
            );
        }
        for (m, good) in [(0, false), (1, true), (1000, true), (1001, false)] {
            assert_eq!(
                ok(InsertOpts {
                    max_attempts: m,
                    ..Default::default()
                }),
                good
            );
        }
        let tags = |n| (0..n).map(|i| format!("t{i}")).collect::<Vec<_>>();
        assert!(ok(InsertOpts {
            tags: tags(20),
            ..Default::default()
        }));
        assert!(!ok(InsertOpts {
            tags: tags(21),
            ..Default::default()
        }));
        let y = |year| Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).single();
        assert!(ok(InsertOpts {
            run_at: y(9999),
            ..Default::default()
        }));
        assert!(!ok(InsertOpts {
            run_at: y(10000),
            ..Default::default()
        }));
        assert!(ok(InsertOpts {
            run_at: y(1),
            ..Default::default()
        }));
        assert!(!ok(InsertOpts {
            run_at: y(0),
            ..Default::default()
        }));
    }

    #[test]
    fn nul_bytes_are_rejected_everywhere() {
        let bad = InsertOpts {
            metadata: json!({"a\u{0}": 1}),
            ..Default::default()
        };
        assert!(matches!(
            validate("k", json!({}), &bad),
            Err(ValidationError::NulByte { .. })
        ));
        assert!(validate("k", json!({"x": ["a\u{0}"]}), &InsertOpts::default()).is_err());
        assert!(validate("k\u{0}", json!({}), &InsertOpts::default()).is_err());
        let tag = InsertOpts {
            tags: vec!["a\u{0}".into()],
            ..Default::default()
        };
        assert!(validate("k", json!({}), &tag).is_err());
    }

    #[test]
    fn nesting_past_the_limit_is_refused_with_its_path() {
        let mut deep = json!(1);
        for _ in 0..MAX_JSON_DEPTH {
            deep = json!({ "n": deep });
        }
        assert!(validate("k", deep.clone(), &InsertOpts::default()).is_ok());
        let too_deep = json!({ "items": [deep] });
        let err = validate("k", too_deep, &InsertOpts::default()).unwrap_err();
        let ValidationError::TooDeep { path, limit } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*limit, MAX_JSON_DEPTH);
        assert!(path.starts_with("args.items[0].n.n"), "{path}");
        assert!(err.to_string().contains("64 levels"), "{err}");
        let bad_key = validate("k", json!({"a b": ["x\u{0}"]}), &InsertOpts::default());
        assert_eq!(
            bad_key,
            Err(ValidationError::NulByte {
                field: "args[\"a b\"][0]".into()
            })
        );
    }

    #[test]
    fn unique_key_ignores_key_order_and_respects_options() {
        let u = UniqueOpts::default();
        let a = unique_key("k", "q", &json!({"a": 1, "b": 2}), None, &u);
        let b = unique_key("k", "q2", &json!({"b": 2, "a": 1}), None, &u);
        assert_eq!(a, b);
        let by_q = UniqueOpts {
            by_queue: true,
            ..u.clone()
        };
        assert_ne!(
            unique_key("k", "q", &json!({}), None, &by_q),
            unique_key("k", "r", &json!({}), None, &by_q)
        );
        let no_args = UniqueOpts {
            by_args: false,
            ..u
        };
        assert_eq!(
            unique_key("k", "q", &json!({"a": 1}), None, &no_args),
            unique_key("k", "q", &json!({"a": 2}), None, &no_args)
        );
    }
}

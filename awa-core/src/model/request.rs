//! The untyped request: kind, JSON args and options as plain data.
//!
//! This is the form requests take when they come from outside Rust's type system — Python's
//! `insert(...)` and `job.enqueue_on_completion(...)` send it as one JSON document — and it is
//! validated by the same [`validate`] as typed requests.

use super::opts::{InsertOpts, UniqueOpts};
use super::state::DEFAULT_UNIQUE_STATES;
use super::validate::{validate, NewJob, ValidationError};
use chrono::{DateTime, Utc};
use serde::Deserialize;

/// Unique options as given by a caller; absent fields take the defaults, so `{}` means the
/// default options.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UntypedUnique {
    pub by_queue: Option<bool>,
    pub by_args: Option<bool>,
    pub by_period: Option<i64>,
    pub states: Option<i64>,
}

/// One request as plain data. Integers are wide here so an out-of-range value is reported by
/// the validator with its real value instead of failing to decode. The option fields repeat
/// [`UntypedOpts`]'s rather than `#[serde(flatten)]` it, because serde cannot combine
/// `flatten` with `deny_unknown_fields`, and an unknown option must be an error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UntypedRequest {
    pub kind: String,
    pub args: serde_json::Value,
    pub queue: Option<String>,
    pub priority: Option<i64>,
    pub max_attempts: Option<i64>,
    pub tags: Option<Vec<String>>,
    pub metadata: Option<serde_json::Value>,
    pub run_at: Option<DateTime<Utc>>,
    pub unique_opts: Option<UntypedUnique>,
    pub ordering_key: Option<String>,
}

impl UntypedRequest {
    /// Parse the JSON form.
    pub fn from_json(text: &str) -> Result<UntypedRequest, ValidationError> {
        serde_json::from_str(text).map_err(|e| super::validate::parse_error("request", &e))
    }

    /// Convert into options, checking integer ranges.
    pub fn opts(&self) -> Result<InsertOpts, ValidationError> {
        UntypedOpts {
            queue: self.queue.clone(),
            priority: self.priority,
            max_attempts: self.max_attempts,
            tags: self.tags.clone(),
            metadata: self.metadata.clone(),
            run_at: self.run_at,
            unique_opts: self.unique_opts.clone(),
            ordering_key: self.ordering_key.clone(),
        }
        .into_insert_opts()
    }

    /// Validate into an insertable job.
    pub fn into_new_job(self) -> Result<NewJob, ValidationError> {
        let opts = self.opts()?;
        validate(&self.kind, self.args, &opts)
    }
}

/// The options of an [`UntypedRequest`] without its kind and args: what a bulk call sends once
/// for a whole batch (or once per job that has options of its own), so that the options are
/// parsed and range-checked once instead of once per job.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UntypedOpts {
    pub queue: Option<String>,
    pub priority: Option<i64>,
    pub max_attempts: Option<i64>,
    pub tags: Option<Vec<String>>,
    pub metadata: Option<serde_json::Value>,
    pub run_at: Option<DateTime<Utc>>,
    pub unique_opts: Option<UntypedUnique>,
    pub ordering_key: Option<String>,
}

impl UntypedOpts {
    /// Parse the JSON form (an object with any of the option fields).
    pub fn from_json(text: &str) -> Result<UntypedOpts, ValidationError> {
        serde_json::from_str(text).map_err(|e| super::validate::parse_error("options", &e))
    }

    /// Convert into options, checking integer ranges; the rest is checked by [`validate`].
    pub fn into_insert_opts(self) -> Result<InsertOpts, ValidationError> {
        let defaults = InsertOpts::default();
        let priority = match self.priority {
            Some(p) => i16::try_from(p).map_err(|_| ValidationError::Priority { value: p })?,
            None => defaults.priority,
        };
        let max_attempts = match self.max_attempts {
            Some(m) => i32::try_from(m).map_err(|_| ValidationError::MaxAttempts { value: m })?,
            None => defaults.max_attempts,
        };
        let unique = match self.unique_opts {
            Some(u) => {
                let states = match u.states {
                    Some(s) => u8::try_from(s)
                        .ok()
                        .filter(|s| *s != 0)
                        .ok_or(ValidationError::UniqueStates { value: s })?,
                    None => DEFAULT_UNIQUE_STATES,
                };
                let d = UniqueOpts::default();
                Some(UniqueOpts {
                    by_queue: u.by_queue.unwrap_or(d.by_queue),
                    by_args: u.by_args.unwrap_or(d.by_args),
                    by_period: u.by_period,
                    states,
                })
            }
            None => None,
        };
        Ok(InsertOpts {
            queue: self.queue.unwrap_or(defaults.queue),
            priority,
            max_attempts,
            run_at: self.run_at,
            tags: self.tags.unwrap_or_default(),
            metadata: self.metadata.unwrap_or(defaults.metadata),
            unique,
            ordering_key: self.ordering_key,
        })
    }
}

//! Insert options, unique options and the typed [`EnqueueRequest`].

use super::kind::derive_kind;
use super::state::DEFAULT_UNIQUE_STATES;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A job's args type. The kind defaults to the type's name in snake_case (see
/// [`derive_kind`]); override [`JobArgs::kind`] to pin it.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
/// impl awa_core::JobArgs for SendEmail {}
/// assert_eq!(<SendEmail as awa_core::JobArgs>::kind(), "send_email");
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    fn kind() -> String {
        let full = std::any::type_name::<Self>();
        // Strip the module path and any generic parameters.
        let base = full.split('<').next().unwrap_or(full);
        let short = base.rsplit("::").next().unwrap_or(base);
        derive_kind(short)
    }
}

/// Deduplication options. A job with unique options gets a key hashed from its kind and the
/// selected parts; the database admits one row per key among rows whose state is in `states`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueOpts {
    /// Include the queue in the key.
    pub by_queue: bool,
    /// Include the args in the key (all of them).
    pub by_args: bool,
    /// Bucket `run_at` (or now) into windows of this many seconds and include the bucket.
    pub by_period: Option<i64>,
    /// Bitmask of [`crate::JobState`] bits in which a row holds its key.
    pub states: u8,
}

impl Default for UniqueOpts {
    fn default() -> Self {
        UniqueOpts {
            by_queue: false,
            by_args: true,
            by_period: None,
            states: DEFAULT_UNIQUE_STATES,
        }
    }
}

/// Options for one insert. Defaults match awa-pg: queue `default`, priority 2, 25 attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct InsertOpts {
    pub queue: String,
    /// 1 (highest) to 4 (lowest).
    pub priority: i16,
    pub max_attempts: i32,
    /// A future time schedules the job; `None` makes it available now.
    pub run_at: Option<DateTime<Utc>>,
    pub tags: Vec<String>,
    /// A JSON object.
    pub metadata: serde_json::Value,
    pub unique: Option<UniqueOpts>,
    /// Stored with the job for the caller's own ordering; not interpreted by the engine.
    pub ordering_key: Option<String>,
}

impl Default for InsertOpts {
    fn default() -> Self {
        InsertOpts {
            queue: "default".to_string(),
            priority: 2,
            max_attempts: 25,
            run_at: None,
            tags: Vec::new(),
            metadata: serde_json::Value::Object(Default::default()),
            unique: None,
            ordering_key: None,
        }
    }
}

/// Typed args plus options: what `insert_with`, registered specs and staging take.
#[derive(Debug, Clone)]
pub struct EnqueueRequest<F: JobArgs> {
    pub args: F,
    pub opts: InsertOpts,
}

impl<F: JobArgs> EnqueueRequest<F> {
    pub fn new(args: F) -> Self {
        EnqueueRequest {
            args,
            opts: InsertOpts::default(),
        }
    }
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.opts.queue = queue.into();
        self
    }
    pub fn priority(mut self, priority: i16) -> Self {
        self.opts.priority = priority;
        self
    }
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.opts.max_attempts = max_attempts;
        self
    }
    pub fn run_at(mut self, run_at: DateTime<Utc>) -> Self {
        self.opts.run_at = Some(run_at);
        self
    }
    pub fn tags(mut self, tags: Vec<String>) -> Self {
        self.opts.tags = tags;
        self
    }
    /// Replace every option at once (use [`Self::unique`] / [`Self::metadata`] to change one).
    pub fn with_opts(mut self, opts: InsertOpts) -> Self {
        self.opts = opts;
        self
    }
    /// Set unique options without replacing the rest of the `InsertOpts`.
    pub fn unique(mut self, unique: UniqueOpts) -> Self {
        self.opts.unique = Some(unique);
        self
    }
    /// Set metadata without replacing the rest of the `InsertOpts`.
    pub fn metadata(mut self, metadata: serde_json::Value) -> Self {
        self.opts.metadata = metadata;
        self
    }
}

impl<F: JobArgs> From<F> for EnqueueRequest<F> {
    fn from(args: F) -> Self {
        EnqueueRequest::new(args)
    }
}

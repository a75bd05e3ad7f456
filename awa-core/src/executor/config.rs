//! Runtime and per-queue configuration.

use crate::error::AwaError;
use std::time::Duration;

/// One queue this client works.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Handlers of this queue running at once.
    pub max_workers: usize,
    /// How long one attempt may run before it is abandoned locally and rescued.
    pub deadline: Duration,
    /// Move failed jobs to the dead-letter queue.
    pub dlq: bool,
    /// Weighted mode (see `executor::pool`): `Some(weight)` makes `max_workers` the queue's
    /// guaranteed minimum (`min_workers`, may be 0) and lets it take slots of the client's
    /// global pool (`RuntimeConfig::global_max_workers`) in proportion to `weight`.
    pub weight: Option<u32>,
    /// Claim at most `burst + max_rate × t` jobs in any `t` (see `executor::rate_limit`).
    pub rate_limit: Option<RateLimit>,
    /// Claim statements of this queue that may be in flight at once (sharing its slots).
    pub claimers: usize,
    /// Most jobs one claim statement takes; `None`: `RuntimeConfig::claim_batch`.
    pub claim_batch: Option<usize>,
    /// Priority aging: claims order a job as if its priority were one better (down to 1) for
    /// every interval it has been due, so old low-priority jobs are not starved.
    pub priority_aging: Option<Duration>,
}

/// A queue's claim rate limit: a token bucket of `burst` tokens refilled at `max_rate` per
/// second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub max_rate: f64,
    pub burst: u32,
}

impl QueueConfig {
    /// A hard-reserved queue: `max_workers` slots of its own.
    pub fn new(max_workers: usize) -> Self {
        QueueConfig {
            max_workers: max_workers.max(1),
            deadline: Duration::from_secs(30 * 60),
            dlq: false,
            weight: None,
            rate_limit: None,
            claimers: 1,
            claim_batch: None,
            priority_aging: None,
        }
    }
    /// A weighted queue: `min_workers` slots of its own, and a `weight`ed share of the global
    /// pool (needs `RuntimeConfig::global_max_workers`).
    pub fn weighted(min_workers: usize, weight: u32) -> Self {
        QueueConfig {
            max_workers: min_workers,
            weight: Some(weight),
            ..QueueConfig::new(1)
        }
    }
    pub fn rate_limit(mut self, max_rate: f64, burst: u32) -> Self {
        self.rate_limit = Some(RateLimit { max_rate, burst });
        self
    }
    pub fn claimers(mut self, claimers: usize) -> Self {
        self.claimers = claimers;
        self
    }
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = Some(n);
        self
    }
    pub fn priority_aging(mut self, interval: Duration) -> Self {
        self.priority_aging = Some(interval);
        self
    }
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
    pub fn dlq(mut self, enabled: bool) -> Self {
        self.dlq = enabled;
        self
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig::new(10)
    }
}

/// Intervals and retention. Defaults suit production; tests shorten them to drive rescue fast.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Safety-net poll when no notification arrives.
    pub poll_interval: Duration,
    pub heartbeat_interval: Duration,
    /// A running job whose heartbeat is older than this is rescued.
    pub heartbeat_staleness: Duration,
    pub heartbeat_rescue_interval: Duration,
    pub deadline_rescue_interval: Duration,
    pub callback_rescue_interval: Duration,
    pub promote_interval: Duration,
    pub leader_election_interval: Duration,
    pub prune_interval: Duration,
    pub completed_retention: Duration,
    pub failed_retention: Duration,
    /// Most finished rows one retention pass deletes (`cleanup_batch_size`).
    pub cleanup_batch: usize,
    /// Most jobs one claim statement takes.
    pub claim_batch: usize,
    /// Handlers this client runs at once over all queues; needed by weighted queues, whose
    /// shared pool is what is left of it after every queue's own slots (`executor::pool`).
    pub global_max_workers: Option<usize>,
    /// Most completions one batched statement applies.
    pub completion_batch: usize,
    /// Per-job finalizations running at once.
    pub finalizer_concurrency: usize,
    /// Longest the runtime waits for one per-job finalization (with its retries). Past it the
    /// job is left to rescue; a statement already sent may still commit, all or nothing. A
    /// batch of completions gets the same bound; past it, a batch with follow-ups hands each
    /// of its jobs to the per-job path.
    pub finalize_deadline: Duration,
    /// Longest one finalization (per-job or batched) waits, in total, for the pool to hand out
    /// a working connection again after a lost connection (a PostgreSQL restart, a killed
    /// backend), with exponential backoff, before each retry. Capped at half of
    /// `heartbeat_staleness`: the waiting jobs keep being heartbeated, and a wait that outlived
    /// the staleness window would let rescue re-run attempts that already executed. Zero
    /// retries at once without waiting. See `finalizer::retry`.
    pub finalize_reconnect_budget: Duration,
    /// Completions with follow-ups (registered Completed specs or staged) join the batched
    /// completer, which commits many of them and their follow-ups in one transaction
    /// (`finalizer::batched`). Off: each takes a per-job transaction of its own, ADR-046's
    /// original path. Both keep every guarantee of the ADR (docs/follow-ups.md).
    pub batch_follow_ups: bool,
    /// Run the maintenance leader election in this client.
    pub maintenance: bool,
    /// Queue storage only: how often the leader reclaims the oldest queue slot whose history
    /// is older than `completed_retention` and moves the queue ring on (awa-pg's
    /// `queue_storage_queue_rotate_interval_ms`, default 1 s).
    pub queue_rotate_interval: Duration,
    /// Queue storage only: how often the leader truncates an empty lease slot and moves the
    /// lease ring on (`queue_storage_lease_rotate_interval_ms`, default 50 ms as in awa-pg).
    /// Each `TRUNCATE` leaves dead rows in `pg_class`, which only a vacuum of the catalog
    /// reclaims (docs/queue-storage-design.md, "Catalog churn"); a longer interval leaves more
    /// dead lease rows per slot between truncations.
    pub lease_rotate_interval: Duration,
    /// How long a queue or kind descriptor may go unrefreshed before the maintenance leader
    /// deletes it (`descriptor_retention_days`); `None` keeps them (awa-pg's `0`).
    pub descriptor_retention: Option<Duration>,
    /// How this runtime takes part in a storage transition (`storage_transition_role`;
    /// `storage::transition`): it decides, with the transition state, the engine the runtime
    /// works. Ignored when the pool handle already names an engine (`Db::with_engine`).
    pub transition_role: crate::storage::transition::TransitionRole,
    /// The queue-storage schema this runtime expects (`queue_storage_schema`); `None` takes
    /// the transition state's. A mismatch refuses to start.
    pub queue_storage_schema: Option<String>,
    /// Queue and lease slot counts a `queue_storage_target` runtime installs a missing schema
    /// with (`queue_storage_queue_slot_count`, `queue_storage_lease_slot_count`: 16 and 8).
    pub queue_storage_slots: (u32, u32),
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            poll_interval: Duration::from_millis(200),
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_staleness: Duration::from_secs(90),
            heartbeat_rescue_interval: Duration::from_secs(30),
            deadline_rescue_interval: Duration::from_secs(30),
            callback_rescue_interval: Duration::from_secs(30),
            promote_interval: Duration::from_millis(250),
            leader_election_interval: Duration::from_secs(10),
            prune_interval: Duration::from_secs(60),
            completed_retention: Duration::from_secs(24 * 3600),
            failed_retention: Duration::from_secs(72 * 3600),
            cleanup_batch: 10_000,
            claim_batch: 64,
            global_max_workers: None,
            completion_batch: 512,
            finalizer_concurrency: 16,
            finalize_deadline: Duration::from_secs(30),
            finalize_reconnect_budget: crate::finalizer::DEFAULT_RECONNECT_BUDGET,
            batch_follow_ups: true,
            maintenance: true,
            queue_rotate_interval: Duration::from_secs(1),
            lease_rotate_interval: Duration::from_millis(50),
            // awa-pg's default: 30 days.
            descriptor_retention: Some(Duration::from_secs(30 * 24 * 3600)),
            transition_role: crate::storage::transition::TransitionRole::Auto,
            queue_storage_schema: None,
            queue_storage_slots: (16, 8),
        }
    }
}

/// The allowed range of one numeric setting: `min ..= max` in `unit`, whole numbers only
/// when `integral`. Checked at the boundary (Python keywords, JSON settings, the Rust
/// builder) so that no user number reaches `Duration::from_*` or a Tokio timer out of range:
/// those panic on NaN, negative and overflowing values, and a zero period panics `interval`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SettingRange {
    pub min: f64,
    pub max: f64,
    pub unit: &'static str,
    pub integral: bool,
}

/// Longest interval, staleness, deadline or timeout accepted in milliseconds: 30 days.
pub const MAX_INTERVAL_MS: f64 = 30.0 * 24.0 * 3600.0 * 1000.0;
/// Longest retention accepted: 10 years, in hours.
pub const MAX_RETENTION_HOURS: f64 = 10.0 * 365.0 * 24.0;
/// Longest callback timeout accepted: 365 days, in seconds.
pub const MAX_CALLBACK_TIMEOUT_SECONDS: f64 = 365.0 * 24.0 * 3600.0;
/// Most workers per queue, jobs per claim or completion batch, and pool connections.
pub const MAX_COUNT: f64 = 10_000.0;
/// Most claim statements one queue may have in flight at once.
pub const MAX_CLAIMERS: f64 = 64.0;

const INTERVAL: SettingRange = SettingRange {
    min: 1.0,
    max: MAX_INTERVAL_MS,
    unit: "milliseconds",
    integral: false,
};

/// The range of a named setting, or None for a name this library does not know.
pub fn setting_range(field: &str) -> Option<SettingRange> {
    Some(match field {
        "poll_interval_ms"
        | "heartbeat_interval_ms"
        | "heartbeat_staleness_ms"
        | "heartbeat_rescue_interval_ms"
        | "deadline_rescue_interval_ms"
        | "callback_rescue_interval_ms"
        | "promote_interval_ms"
        | "leader_election_interval_ms"
        | "prune_interval_ms"
        | "finalize_deadline_ms"
        | "deadline_ms"
        | "deadline_duration_ms"
        | "priority_aging_interval_ms"
        | "terminal_count_rollup_interval_ms"
        | "queue_storage_queue_rotate_interval_ms"
        | "queue_storage_lease_rotate_interval_ms"
        | "queue_storage_claim_rotate_interval_ms" => INTERVAL,
        // Ring sizes: at most 256 slots each (storage::queue_storage); the lower bounds of
        // awa-pg (4 queue slots, 2 lease slots) are checked when the schema is installed.
        "queue_storage_queue_slot_count"
        | "queue_storage_lease_slot_count"
        | "queue_storage_claim_slot_count"
        | "queue_storage_queue_stripe_count" => SettingRange {
            min: 1.0,
            max: 256.0,
            unit: "",
            integral: true,
        },
        // 0 stops at once, cancelling running handlers.
        "timeout_ms" => SettingRange {
            min: 0.0,
            ..INTERVAL
        },
        "completed_retention_hours" | "failed_retention_hours" => SettingRange {
            min: 0.0,
            max: MAX_RETENTION_HOURS,
            unit: "hours",
            integral: false,
        },
        "timeout_seconds" => SettingRange {
            min: 0.001,
            max: MAX_CALLBACK_TIMEOUT_SECONDS,
            unit: "seconds",
            integral: false,
        },
        "max_workers" | "claim_batch" | "completion_batch" | "max_connections"
        | "global_max_workers" | "weight" | "claim_batch_size" | "rate_limit.burst" => {
            SettingRange {
                min: 1.0,
                max: MAX_COUNT,
                unit: "",
                integral: true,
            }
        }
        "min_workers" => SettingRange {
            min: 0.0,
            max: MAX_COUNT,
            unit: "",
            integral: true,
        },
        "claimers" => SettingRange {
            min: 1.0,
            max: MAX_CLAIMERS,
            unit: "",
            integral: true,
        },
        "cleanup_batch_size" => SettingRange {
            min: 1.0,
            max: 1_000_000.0,
            unit: "",
            integral: true,
        },
        "rate_limit.max_rate" => SettingRange {
            min: 0.001,
            max: 1_000_000.0,
            unit: "jobs per second",
            integral: false,
        },
        // 0 disables descriptor retention (as in awa-pg).
        "descriptor_retention_days" => SettingRange {
            min: 0.0,
            max: MAX_RETENTION_HOURS / 24.0,
            unit: "days",
            integral: false,
        },
        _ => return None,
    })
}

/// Check one numeric setting against [`setting_range`]; the error names the field, the value
/// and the allowed range.
pub fn check_setting(field: &str, value: f64) -> Result<f64, AwaError> {
    let range =
        setting_range(field).ok_or_else(|| AwaError::Config(format!("unknown setting {field}")))?;
    let in_range = value.is_finite() && value >= range.min && value <= range.max;
    if in_range && (!range.integral || value.fract() == 0.0) {
        return Ok(value);
    }
    let kind = if range.integral {
        "a whole number"
    } else {
        "a number"
    };
    let unit = if range.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", range.unit)
    };
    Err(AwaError::Config(format!(
        "{field} is {value}; it must be {kind} between {} and {}{unit}",
        range.min, range.max
    )))
}

/// A checked millisecond setting as a `Duration`.
pub fn setting_millis(field: &str, value: f64) -> Result<Duration, AwaError> {
    Ok(Duration::from_secs_f64(
        check_setting(field, value)? / 1000.0,
    ))
}

/// A checked count setting.
pub fn setting_count(field: &str, value: f64) -> Result<usize, AwaError> {
    // In range and whole, so the conversion is exact.
    Ok(check_setting(field, value)? as usize)
}

impl RuntimeConfig {
    /// Refuse values that would stall or panic the runtime (a zero period, an interval past
    /// [`MAX_INTERVAL_MS`], a zero or huge batch); run by `ClientBuilder::build`.
    pub fn validate(&self) -> Result<(), AwaError> {
        let intervals = [
            ("poll_interval_ms", self.poll_interval),
            ("heartbeat_interval_ms", self.heartbeat_interval),
            ("heartbeat_staleness_ms", self.heartbeat_staleness),
            (
                "heartbeat_rescue_interval_ms",
                self.heartbeat_rescue_interval,
            ),
            ("deadline_rescue_interval_ms", self.deadline_rescue_interval),
            ("callback_rescue_interval_ms", self.callback_rescue_interval),
            ("promote_interval_ms", self.promote_interval),
            ("leader_election_interval_ms", self.leader_election_interval),
            ("prune_interval_ms", self.prune_interval),
            ("finalize_deadline_ms", self.finalize_deadline),
        ];
        for (field, d) in intervals {
            check_setting(field, d.as_secs_f64() * 1000.0)?;
        }
        for (field, d) in [
            ("completed_retention_hours", self.completed_retention),
            ("failed_retention_hours", self.failed_retention),
        ] {
            check_setting(field, d.as_secs_f64() / 3600.0)?;
        }
        if let Some(d) = self.descriptor_retention {
            check_setting("descriptor_retention_days", d.as_secs_f64() / 86_400.0)?;
        }
        for (field, n) in [
            ("claim_batch", self.claim_batch),
            ("completion_batch", self.completion_batch),
            ("cleanup_batch_size", self.cleanup_batch),
        ] {
            check_setting(field, n as f64)?;
        }
        if let Some(n) = self.global_max_workers {
            check_setting("global_max_workers", n as f64)?;
        }
        if self.finalizer_concurrency == 0 {
            return Err(AwaError::Config(
                "finalizer_concurrency is 0; it must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl QueueConfig {
    /// Refuse a deadline or worker count that would panic or stall the runtime.
    pub fn validate(&self, queue: &str) -> Result<(), AwaError> {
        let named = |e: AwaError| AwaError::Config(format!("queue {queue:?}: {e}"));
        match self.weight {
            None => check_setting("max_workers", self.max_workers as f64),
            Some(w) => check_setting("min_workers", self.max_workers as f64)
                .and_then(|_| check_setting("weight", f64::from(w))),
        }
        .map_err(named)?;
        check_setting("deadline_ms", self.deadline.as_secs_f64() * 1000.0).map_err(named)?;
        check_setting("claimers", self.claimers as f64).map_err(named)?;
        if let Some(n) = self.claim_batch {
            check_setting("claim_batch_size", n as f64).map_err(named)?;
        }
        if let Some(d) = self.priority_aging {
            check_setting("priority_aging_interval_ms", d.as_secs_f64() * 1000.0).map_err(named)?;
        }
        if let Some(r) = self.rate_limit {
            check_setting("rate_limit.max_rate", r.max_rate).map_err(named)?;
            check_setting("rate_limit.burst", f64::from(r.burst)).map_err(named)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_nan_infinite_negative_and_huge_values() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 1e16, 0.0] {
            let e = check_setting("poll_interval_ms", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("poll_interval_ms"), "{e}");
            assert!(e.contains("2592000000"), "{e}");
        }
        assert!(check_setting("poll_interval_ms", 1.0).is_ok());
        assert!(check_setting("timeout_ms", 0.0).is_ok());
        assert!(check_setting("max_workers", 2.5).is_err());
        assert!(check_setting("max_workers", 10_001.0).is_err());
        assert!(check_setting("completed_retention_hours", 1e16).is_err());
        assert!(check_setting("timeout_seconds", 1e300).is_err());
        assert!(RuntimeConfig::default().validate().is_ok());
        let zero = RuntimeConfig {
            poll_interval: Duration::ZERO,
            ..RuntimeConfig::default()
        };
        assert!(zero.validate().is_err());
        assert!(QueueConfig::default().validate("q").is_ok());
    }
}

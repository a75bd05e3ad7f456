//! Runtime and per-queue configuration.

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
}

impl QueueConfig {
    pub fn new(max_workers: usize) -> Self {
        QueueConfig {
            max_workers: max_workers.max(1),
            deadline: Duration::from_secs(30 * 60),
            dlq: false,
        }
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
    /// Most jobs one claim statement takes.
    pub claim_batch: usize,
    /// Most completions one batched statement applies.
    pub completion_batch: usize,
    /// Per-job finalizations running at once.
    pub finalizer_concurrency: usize,
    /// Longest the runtime waits for one per-job finalization (with its retries). Past it the
    /// job is left to rescue; a statement already sent may still commit, all or nothing.
    pub finalize_deadline: Duration,
    /// Longest one finalization (per-job or batched) waits, in total, for the pool to hand out
    /// a working connection again after a lost connection (a PostgreSQL restart, a killed
    /// backend), with exponential backoff, before each retry. Capped at half of
    /// `heartbeat_staleness`: the waiting jobs keep being heartbeated, and a wait that outlived
    /// the staleness window would let rescue re-run attempts that already executed. Zero
    /// retries at once without waiting. See `finalizer::retry`.
    pub finalize_reconnect_budget: Duration,
    /// Run the maintenance leader election in this client.
    pub maintenance: bool,
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
            claim_batch: 64,
            completion_batch: 512,
            finalizer_concurrency: 16,
            finalize_deadline: Duration::from_secs(30),
            finalize_reconnect_budget: crate::finalizer::DEFAULT_RECONNECT_BUDGET,
            maintenance: true,
        }
    }
}

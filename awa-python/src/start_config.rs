//! `start()`'s configuration as the Python package sends it (JSON built by
//! `python/awa/_worker_config.py`), turned into the engine's `RuntimeConfig` and
//! `QueueConfig`s.
//!
//! The package has already checked shapes; this side refuses unknown fields again
//! (`deny_unknown_fields`, so a key can never be accepted and dropped on the way) and checks
//! every number by name against the engine's range table (`check_setting`), so a negative,
//! huge or fractional value is an `AwaError::Config` naming the field, whoever built the JSON.

use awa_core::executor::config::{check_setting, setting_count, setting_millis};
use awa_core::storage::descriptors::Descriptor;
use awa_core::{AwaError, QueueConfig, RuntimeConfig};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartConfig {
    pub(crate) queues: Vec<QueueSpec>,
    #[serde(default)]
    intervals: HashMap<String, f64>,
    #[serde(default)]
    claim_batch: Option<f64>,
    #[serde(default)]
    completion_batch: Option<f64>,
    #[serde(default)]
    global_max_workers: Option<f64>,
    #[serde(default)]
    cleanup_batch_size: Option<f64>,
    /// `RuntimeConfig::batch_follow_ups` (an addition to awa-pg's `start()`).
    #[serde(default)]
    batch_follow_ups: Option<bool>,
    /// Days an unrefreshed descriptor is kept; 0 keeps them for good.
    #[serde(default)]
    descriptor_retention_days: Option<f64>,
    /// `queue_descriptor(...)` declarations, by queue.
    #[serde(default)]
    pub(crate) queue_descriptors: BTreeMap<String, Descriptor>,
    /// `job_kind_descriptor(...)` declarations, by kind.
    #[serde(default)]
    pub(crate) job_kind_descriptors: BTreeMap<String, Descriptor>,
    #[serde(default)]
    queue_storage: Option<QueueStorageStart>,
}

/// `start()`'s `queue_storage_*` and `storage_transition_role` keywords (checked by the
/// package; counts and intervals again here).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueStorageStart {
    schema: Option<String>,
    queue_slot_count: f64,
    lease_slot_count: f64,
    queue_rotate_interval_ms: f64,
    lease_rotate_interval_ms: f64,
    transition_role: Option<String>,
}

/// One queue: `max_workers` (hard-reserved) or `min_workers` + `weight` (weighted).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueSpec {
    pub(crate) name: String,
    #[serde(default)]
    max_workers: Option<f64>,
    #[serde(default)]
    min_workers: Option<f64>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    deadline_ms: Option<f64>,
    #[serde(default)]
    dlq: bool,
    /// `[max_rate, burst]`.
    #[serde(default)]
    rate_limit: Option<(f64, f64)>,
    #[serde(default)]
    claimers: Option<f64>,
    #[serde(default)]
    claim_batch_size: Option<f64>,
    #[serde(default)]
    priority_aging_interval_ms: Option<f64>,
}

pub(crate) fn parse(json: &str) -> Result<StartConfig, AwaError> {
    serde_json::from_str(json).map_err(|e| AwaError::Config(format!("start() settings: {e}")))
}

pub(crate) fn runtime_config(cfg: &StartConfig) -> Result<RuntimeConfig, AwaError> {
    let mut rc = RuntimeConfig::default();
    for (key, value) in &cfg.intervals {
        let ms = || setting_millis(key, *value);
        match key.as_str() {
            "poll_interval_ms" => rc.poll_interval = ms()?,
            "heartbeat_interval_ms" => rc.heartbeat_interval = ms()?,
            "heartbeat_staleness_ms" => rc.heartbeat_staleness = ms()?,
            "heartbeat_rescue_interval_ms" => rc.heartbeat_rescue_interval = ms()?,
            "deadline_rescue_interval_ms" => rc.deadline_rescue_interval = ms()?,
            "callback_rescue_interval_ms" => rc.callback_rescue_interval = ms()?,
            "promote_interval_ms" => rc.promote_interval = ms()?,
            "leader_election_interval_ms" => rc.leader_election_interval = ms()?,
            "prune_interval_ms" => rc.prune_interval = ms()?,
            "finalize_deadline_ms" => rc.finalize_deadline = ms()?,
            "completed_retention_hours" | "failed_retention_hours" => {
                let hours = Duration::from_secs_f64(check_setting(key, *value)? * 3600.0);
                if key == "completed_retention_hours" {
                    rc.completed_retention = hours;
                } else {
                    rc.failed_retention = hours;
                }
            }
            other => return Err(AwaError::Config(format!("unknown setting {other}"))),
        }
    }
    if let Some(b) = cfg.claim_batch {
        rc.claim_batch = setting_count("claim_batch", b)?;
    }
    if let Some(b) = cfg.completion_batch {
        rc.completion_batch = setting_count("completion_batch", b)?;
    }
    if let Some(on) = cfg.batch_follow_ups {
        rc.batch_follow_ups = on;
    }
    if let Some(n) = cfg.global_max_workers {
        rc.global_max_workers = Some(setting_count("global_max_workers", n)?);
    }
    if let Some(n) = cfg.cleanup_batch_size {
        rc.cleanup_batch = setting_count("cleanup_batch_size", n)?;
    }
    if let Some(qs) = &cfg.queue_storage {
        let slots = |field: &str, v: f64| -> Result<u32, AwaError> {
            let n = setting_count(field, v)?;
            Ok(u32::try_from(n).unwrap_or(u32::MAX))
        };
        rc.queue_storage_slots = (
            slots("queue_storage_queue_slot_count", qs.queue_slot_count)?,
            slots("queue_storage_lease_slot_count", qs.lease_slot_count)?,
        );
        rc.queue_rotate_interval = setting_millis(
            "queue_storage_queue_rotate_interval_ms",
            qs.queue_rotate_interval_ms,
        )?;
        rc.lease_rotate_interval = setting_millis(
            "queue_storage_lease_rotate_interval_ms",
            qs.lease_rotate_interval_ms,
        )?;
        rc.queue_storage_schema = qs.schema.clone();
        if let Some(role) = &qs.transition_role {
            rc.transition_role = awa_core::storage::transition::TransitionRole::parse(role)?;
        }
    }
    if let Some(days) = cfg.descriptor_retention_days {
        let days = check_setting("descriptor_retention_days", days)?;
        rc.descriptor_retention = (days > 0.0).then(|| Duration::from_secs_f64(days * 86_400.0));
    }
    Ok(rc)
}

/// A queue's settings, range-checked and named in the error.
pub(crate) fn queue_config(q: &QueueSpec) -> Result<QueueConfig, AwaError> {
    let named = |e: AwaError| AwaError::Config(format!("queue {:?}: {e}", q.name));
    let count = |field: &str, v: f64| setting_count(field, v).map_err(named);
    let mut qc =
        match (q.max_workers, q.min_workers, q.weight) {
            (Some(max), None, None) => QueueConfig::new(count("max_workers", max)?),
            (None, min, weight) if min.is_some() || weight.is_some() => {
                let min = min.map_or(Ok(0), |m| count("min_workers", m))?;
                let weight = weight.map_or(Ok(1), |w| count("weight", w))?;
                // At most MAX_COUNT (checked), so it fits.
                QueueConfig::weighted(min, u32::try_from(weight).unwrap_or(u32::MAX))
            }
            (Some(_), _, _) => return Err(named(AwaError::Config(
                "use max_workers for hard-reserved mode or min_workers for weighted mode, not both"
                    .into(),
            ))),
            (None, _, _) => {
                return Err(named(AwaError::Config(
                    "needs max_workers, or min_workers/weight with global_max_workers".into(),
                )))
            }
        };
    qc = qc.dlq(q.dlq);
    if let Some(ms) = q.deadline_ms {
        qc = qc.deadline(setting_millis("deadline_ms", ms).map_err(named)?);
    }
    if let Some((rate, burst)) = q.rate_limit {
        let rate = check_setting("rate_limit.max_rate", rate).map_err(named)?;
        let burst = count("rate_limit.burst", burst)?;
        qc = qc.rate_limit(rate, u32::try_from(burst).unwrap_or(u32::MAX));
    }
    if let Some(n) = q.claimers {
        qc = qc.claimers(count("claimers", n)?);
    }
    if let Some(n) = q.claim_batch_size {
        qc = qc.claim_batch(count("claim_batch_size", n)?);
    }
    if let Some(ms) = q.priority_aging_interval_ms {
        qc = qc.priority_aging(setting_millis("priority_aging_interval_ms", ms).map_err(named)?);
    }
    Ok(qc)
}

//! Job states and the unique-states bitmask.
//!
//! The bit of each state is its position in [`JobState::ALL`]; the same numbering is used by the
//! SQL function `awa.state_bit` that backs `idx_awa_jobs_unique`, and by Python's `states` integer.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The lifecycle state of a job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Scheduled,
    Available,
    Running,
    Completed,
    Retryable,
    Failed,
    Cancelled,
    WaitingExternal,
}

impl JobState {
    /// Every state, in bit order.
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
        JobState::Completed,
        JobState::Retryable,
        JobState::Failed,
        JobState::Cancelled,
        JobState::WaitingExternal,
    ];

    /// The name stored in `awa.jobs.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Retryable => "retryable",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::WaitingExternal => "waiting_external",
        }
    }

    /// This state's bit in a unique-states mask.
    pub fn bit(self) -> u8 {
        let pos = JobState::ALL.iter().position(|s| *s == self).unwrap_or(0);
        1u8 << pos
    }

    /// Whether the state is final (no further transitions without an admin action).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of [`JobState::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .iter()
            .copied()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// Build a unique-states mask from states.
pub fn states_mask(states: &[JobState]) -> u8 {
    states.iter().fold(0, |m, s| m | s.bit())
}

/// The default unique states: scheduled, available, running, completed, retryable.
pub const DEFAULT_UNIQUE_STATES: u8 = 0b0001_1111;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mask_matches_states() {
        let m = states_mask(&[
            JobState::Scheduled,
            JobState::Available,
            JobState::Running,
            JobState::Completed,
            JobState::Retryable,
        ]);
        assert_eq!(m, DEFAULT_UNIQUE_STATES);
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().ok(), Some(s));
        }
    }
}

//! Executable twins of the TLA+ models in `correctness/`.
//!
//! No registry serves the TLA+ tools, so CI cannot run TLC. Each model here is
//! a line-for-line twin of a `.tla` file, with the same state, the same action
//! names, the same invariants and the same seeded-bug variants, checked by an
//! exhaustive breadth-first search with [`stateright`]. The `.tla` files stay
//! the reference and are checked with TLC outside CI; see `correctness/README.md`.

pub mod queue_rotation;
pub mod set;
pub mod staged_follow_ups;

pub use queue_rotation::AwaQueueRotation;
pub use staged_follow_ups::{AwaStagedFollowUps, Variant};

//! Executable twins of the TLA+ models in `correctness/`.
//!
//! Each model here is a line-for-line twin of a `.tla` file, with the same
//! state, the same action names, the same invariants and the same seeded-bug
//! variants, checked by an exhaustive breadth-first search with [`stateright`]
//! in `cargo test`. The `.tla` files stay the reference: `correctness/tlc.py`
//! runs TLC on every configuration in the test suite too, and the twins' tests
//! hold both to the same state counts and counterexample lengths (see
//! `correctness/README.md`).

pub mod harness;
pub mod queue_rotation;
pub mod set;
pub mod stable_point;
pub mod staged_follow_ups;

pub use queue_rotation::AwaQueueRotation;
pub use stable_point::AwaStablePoint;
pub use staged_follow_ups::{AwaStagedFollowUps, Variant};

//! The data model: job rows and states, insert options, kind derivation and validation.

pub mod callback_rules;
pub(crate) mod job;
mod kind;
mod opts;
mod request;
mod state;
pub mod unique_key;
pub(crate) mod validate;

pub use callback_rules::{CallbackRules, Decision, DefaultAction};
pub use job::{JobError as JobErrorEntry, JobRow};
pub use kind::derive_kind;
pub use opts::{EnqueueRequest, InsertOpts, JobArgs, UniqueOpts};
pub use request::{UntypedOpts, UntypedRequest, UntypedUnique};
pub use state::{states_mask, JobState, UnknownState, DEFAULT_UNIQUE_STATES};
pub use validate::{validate, NewJob, ValidationError, MAX_JSON_DEPTH};

//! Registered follow-up specs (ADR-029): follow-ups derived from a job's args and row,
//! inserted in the same transaction as the outcome they are registered for.
//!
//! A spec is a closure stored type-erased per kind and event. It runs inside the finalization
//! transaction (never in Python); a unique conflict on its follow-up is skipped under a
//! savepoint, while any other failure — a bad request, an insert error, a panic — rolls the
//! outcome back.

use crate::error::AwaError;
use crate::model::{validate, EnqueueRequest, JobArgs, JobRow, NewJob};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The outcome a spec is registered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecEvent {
    Completed,
    /// Failed for good: terminal error, exhausted attempts, or a poisoned attempt.
    Exhausted,
    /// Going to be retried (retryable error, panic, RetryAfter).
    Retried,
    Cancelled,
}

type SpecFn = Arc<dyn Fn(&JobRow) -> Result<Option<NewJob>, AwaError> + Send + Sync>;

/// Every registered spec, by kind and event.
#[derive(Clone, Default)]
pub struct Specs {
    by_kind: HashMap<(String, SpecEvent), Vec<SpecFn>>,
}

impl Specs {
    pub(crate) fn add<A, B, F>(&mut self, event: SpecEvent, f: F)
    where
        A: JobArgs,
        B: JobArgs,
        F: Fn(&A, &JobRow) -> Option<EnqueueRequest<B>> + Send + Sync + 'static,
    {
        let spec: SpecFn = Arc::new(move |job: &JobRow| {
            let args: A = serde_json::from_value(job.args.clone())?;
            let request = catch_unwind(AssertUnwindSafe(|| f(&args, job))).map_err(|_| {
                AwaError::State(format!("follow-up spec for {} panicked", job.kind))
            })?;
            match request {
                None => Ok(None),
                Some(r) => {
                    let value = serde_json::to_value(&r.args)?;
                    Ok(Some(validate(&B::kind(), value, &r.opts)?))
                }
            }
        });
        self.by_kind
            .entry((A::kind(), event))
            .or_default()
            .push(spec);
    }

    /// Whether any spec is registered for `kind` and `event`.
    pub fn has(&self, kind: &str, event: SpecEvent) -> bool {
        self.by_kind.contains_key(&(kind.to_string(), event))
    }

    /// Whether any kind has a spec for `event`.
    pub fn has_any(&self, event: SpecEvent) -> bool {
        self.by_kind.keys().any(|(_, e)| *e == event)
    }

    /// Build the follow-ups for a job's outcome, in registration order.
    pub(crate) fn follow_ups(
        &self,
        job: &JobRow,
        event: SpecEvent,
    ) -> Result<Vec<NewJob>, AwaError> {
        let Some(specs) = self.by_kind.get(&(job.kind.clone(), event)) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(j) = spec(job)? {
                out.push(j);
            }
        }
        Ok(out)
    }
}

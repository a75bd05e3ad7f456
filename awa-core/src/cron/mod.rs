//! Periodic (cron) jobs: named schedules in `awa.cron_jobs` that the maintenance leader turns
//! into jobs, exactly once per fire time across every client of a database.
//!
//! - [`schedule`]: parsing expressions (five fields, or six with seconds) in IANA zones and
//!   computing fire times, DST included; pure, clock injected.
//! - [`storage`]: the registered definition ([`PeriodicJob`]), the upsert at start, and the
//!   operations a CLI or UI needs: list, delete, pause, resume, trigger.
//! - [`evaluate`]: the leader's duty, one compare-and-set transaction per schedule.
//!
//! See `docs/periodic.md`.

pub mod evaluate;
pub mod fault;
pub mod schedule;
pub mod storage;

pub use evaluate::{due_fires, evaluate, evaluate_at, CATCH_UP_LIMIT, MISSED_AFTER};
pub use schedule::{Schedule, ScheduleError};
pub use storage::{
    delete, get, list, set_paused, trigger, upsert, CronJobRow, MissedFirePolicy, PeriodicJob,
    META_FIRE_AT, META_NAME, META_TRIGGERED,
};

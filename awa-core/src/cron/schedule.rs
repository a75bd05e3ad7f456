//! Cron expressions in an IANA time zone, and the fire times they produce.
//!
//! Matching is done by `croner` on *wall-clock* (naive local) times; this module maps each
//! matching wall-clock time to one instant, which is where daylight-saving changes are
//! decided (see `docs/periodic.md`, "Time zones and DST"):
//!
//! - a wall-clock time that does not exist (spring forward) fires once, at the first instant
//!   after the gap (the transition itself); several such times, and a match at the first
//!   valid time after the gap, collapse into that one fire;
//! - a wall-clock time that exists twice (fall back) fires once, at its first occurrence; the
//!   repeated hour produces no second fire.
//!
//! Everything here is pure: the caller passes "now", so tests drive it with any clock.

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// How many matching wall-clock times [`Schedule::next_after`] inspects before it gives up.
/// Only the repeated hour of a fall-back change skips matches (at most 3,600 for a
/// every-second schedule), so this is never reached by an expression that fires at all.
const MAX_SKIPPED_MATCHES: usize = 10_000;

/// Why an expression or a zone was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("invalid cron expression {expr:?}: {reason}")]
    Expression { expr: String, reason: String },
    #[error("invalid timezone {timezone:?}: not an IANA time zone name (e.g. \"Europe/London\")")]
    TimeZone { timezone: String },
}

/// A parsed expression plus its zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    tz: Tz,
    cron: Cron,
}

impl Schedule {
    /// Parse `expr` (five fields, or six with seconds first; `@hourly`-style nicknames too)
    /// in the IANA zone `timezone`. An expression that never matches is rejected.
    pub fn parse(expr: &str, timezone: &str) -> Result<Schedule, ScheduleError> {
        let tz: Tz = timezone.parse().map_err(|_| ScheduleError::TimeZone {
            timezone: timezone.to_string(),
        })?;
        let bad = |reason: String| ScheduleError::Expression {
            expr: expr.to_string(),
            reason,
        };
        let trimmed = expr.trim();
        let fields = trimmed.split_whitespace().count();
        if !trimmed.starts_with('@') && fields != 5 && fields != 6 {
            return Err(bad(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds \
                 first), got {fields}"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(trimmed)
            .map_err(|e| bad(e.to_string()))?;
        let schedule = Schedule {
            expr: expr.to_string(),
            tz,
            cron,
        };
        // An expression such as "0 0 30 2 *" parses but never fires.
        if schedule.next_after(Utc::now()).is_none() {
            return Err(bad("it never fires".into()));
        }
        Ok(schedule)
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The first fire strictly after `t`, or `None` when there is none.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut cursor = t.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_SKIPPED_MATCHES {
            let wall = self.cron.find_next_occurrence(&cursor, false).ok()?;
            let at = self.instant_of(wall)?;
            if at > t {
                return Some(at);
            }
            // A repeated (fall-back) wall time whose first occurrence already passed.
            cursor = wall;
        }
        None
    }

    /// The fires in `(after, until]`, earliest first, at most `limit` of them.
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = after;
        while out.len() < limit {
            match self.next_after(t) {
                Some(at) if at <= until => {
                    out.push(at);
                    t = at;
                }
                _ => break,
            }
        }
        out
    }

    /// The latest fire in `(after, until]`, found without walking every fire in between
    /// (a schedule that was idle for a year has millions of every-second fires).
    pub fn latest_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let local = until.with_timezone(&self.tz).naive_local();
        let wall = self.cron.find_previous_occurrence(&local, true).ok()?;
        // In the repeated hour of a fall-back change, the previous wall-clock match can be an
        // earlier fire than the latest one, so walk forward from it to `until`; outside that
        // hour the first step already passes `until`.
        let mut latest = self.instant_of(wall).filter(|at| *at <= until);
        let mut t = latest.unwrap_or(after).max(after);
        for _ in 0..MAX_SKIPPED_MATCHES {
            match self.next_after(t) {
                Some(at) if at <= until => {
                    latest = Some(at);
                    t = at;
                }
                _ => break,
            }
        }
        latest.filter(|at| *at > after)
    }

    /// The one instant a matching wall-clock time fires at.
    fn instant_of(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.tz.from_local_datetime(&wall) {
            chrono::LocalResult::Single(d) => Some(d.with_timezone(&Utc)),
            chrono::LocalResult::Ambiguous(a, b) => Some(a.min(b).with_timezone(&Utc)),
            chrono::LocalResult::None => self.gap_end(wall),
        }
    }

    /// The first instant whose wall-clock time is after `wall`, a time inside a gap: the
    /// instant the clocks jumped. Binary search over whole seconds in a window of ±15 h
    /// around `wall` read as UTC (every offset lies within it, so the wall-clock time at the
    /// window's start is before `wall` and at its end after it).
    fn gap_end(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        let window = chrono::Duration::hours(15);
        let base = wall.and_utc().timestamp();
        let mut lo = base.checked_sub(window.num_seconds())?;
        let mut hi = base.checked_add(window.num_seconds())?;
        let local_at = |secs: i64| {
            DateTime::<Utc>::from_timestamp(secs, 0)
                .map(|d| d.with_timezone(&self.tz).naive_local())
        };
        // Invariant: local(lo) <= wall < local(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if local_at(mid)? > wall {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        DateTime::<Utc>::from_timestamp(hi, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn fires(expr: &str, tz: &str, from: &str, to: &str) -> Vec<String> {
        let s = Schedule::parse(expr, tz).unwrap();
        s.fires_between(utc(from), utc(to), 1000)
            .into_iter()
            .map(|d| d.to_rfc3339())
            .collect()
    }

    #[test]
    fn five_and_six_fields() {
        assert_eq!(
            fires(
                "*/15 * * * *",
                "UTC",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:45:00Z"
            ),
            [
                "2026-01-01T00:15:00+00:00",
                "2026-01-01T00:30:00+00:00",
                "2026-01-01T00:45:00+00:00"
            ]
        );
        assert_eq!(
            fires(
                "*/20 * * * * *",
                "UTC",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:01:00Z"
            ),
            [
                "2026-01-01T00:00:20+00:00",
                "2026-01-01T00:00:40+00:00",
                "2026-01-01T00:01:00+00:00"
            ]
        );
        assert_eq!(
            fires(
                "@hourly",
                "UTC",
                "2026-01-01T00:00:00Z",
                "2026-01-01T02:00:00Z"
            )
            .len(),
            2
        );
    }

    #[test]
    fn rejects_bad_expressions_and_zones() {
        for bad in [
            "",
            "* * *",
            "* * * * * * *",
            "61 * * * *",
            "* * * * MOO",
            "nonsense",
        ] {
            let e = Schedule::parse(bad, "UTC").unwrap_err();
            assert!(
                matches!(e, ScheduleError::Expression { .. }),
                "{bad:?} gave {e:?}"
            );
            assert!(e.to_string().contains("invalid cron expression"), "{e}");
        }
        let never = Schedule::parse("0 0 30 2 *", "UTC").unwrap_err();
        assert!(never.to_string().contains("never fires"), "{never}");
        for bad in ["Mars/Olympus", "", "utc+5", "Europe/Londn"] {
            let e = Schedule::parse("* * * * *", bad).unwrap_err();
            assert_eq!(
                e,
                ScheduleError::TimeZone {
                    timezone: bad.into()
                }
            );
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn local_time_in_a_zone() {
        // 09:00 in New York is 14:00 UTC in winter and 13:00 UTC in summer.
        assert_eq!(
            fires(
                "0 9 * * *",
                "America/New_York",
                "2026-01-10T00:00:00Z",
                "2026-01-11T00:00:00Z"
            ),
            ["2026-01-10T14:00:00+00:00"]
        );
        assert_eq!(
            fires(
                "0 9 * * *",
                "America/New_York",
                "2026-07-10T00:00:00Z",
                "2026-07-11T00:00:00Z"
            ),
            ["2026-07-10T13:00:00+00:00"]
        );
    }

    #[test]
    fn spring_forward_gap_fires_once_at_the_transition() {
        // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC). 02:30 does not exist.
        assert_eq!(
            fires(
                "30 2 * * *",
                "America/New_York",
                "2026-03-07T12:00:00Z",
                "2026-03-09T12:00:00Z"
            ),
            ["2026-03-08T07:00:00+00:00", "2026-03-09T06:30:00+00:00"]
        );
        // Every 15 minutes: 02:00..02:45 are all missing; they and 03:00 fire once at 07:00 UTC.
        assert_eq!(
            fires(
                "*/15 * * * *",
                "America/New_York",
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:30:00Z"
            ),
            [
                "2026-03-08T06:45:00+00:00",
                "2026-03-08T07:00:00+00:00",
                "2026-03-08T07:15:00+00:00",
                "2026-03-08T07:30:00+00:00"
            ]
        );
        // London, 2026-03-29: 01:00 GMT jumps to 02:00 BST (01:00 UTC).
        assert_eq!(
            fires(
                "30 1 * * *",
                "Europe/London",
                "2026-03-28T12:00:00Z",
                "2026-03-30T12:00:00Z"
            ),
            ["2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"]
        );
    }

    #[test]
    fn fall_back_repeated_time_fires_once() {
        // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice
        // (05:30 and 06:30 UTC) and fires only at the first.
        assert_eq!(
            fires(
                "30 1 * * *",
                "America/New_York",
                "2026-10-31T12:00:00Z",
                "2026-11-02T12:00:00Z"
            ),
            ["2026-11-01T05:30:00+00:00", "2026-11-02T06:30:00+00:00"]
        );
        // Every 30 minutes: the repeated hour (05:00..06:00 UTC seen again as 01:xx EST) is
        // skipped, so 01:00 and 01:30 fire once each.
        assert_eq!(
            fires(
                "*/30 * * * *",
                "America/New_York",
                "2026-11-01T04:00:00Z",
                "2026-11-01T07:30:00Z"
            ),
            [
                "2026-11-01T04:30:00+00:00",
                "2026-11-01T05:00:00+00:00",
                "2026-11-01T05:30:00+00:00",
                "2026-11-01T07:00:00+00:00",
                "2026-11-01T07:30:00+00:00"
            ]
        );
        // London, 2026-10-25: 02:00 BST falls back to 01:00 GMT; 01:15 fires at 00:15 UTC.
        assert_eq!(
            fires(
                "15 1 * * *",
                "Europe/London",
                "2026-10-24T12:00:00Z",
                "2026-10-26T12:00:00Z"
            ),
            ["2026-10-25T00:15:00+00:00", "2026-10-26T01:15:00+00:00"]
        );
    }

    #[test]
    fn next_after_from_inside_the_repeated_hour() {
        let s = Schedule::parse("*/30 * * * *", "America/New_York").unwrap();
        // 05:40 UTC is 01:40 EDT (first pass), 06:10 UTC is 01:10 EST (second pass).
        assert_eq!(
            s.next_after(utc("2026-11-01T05:40:00Z")).unwrap(),
            utc("2026-11-01T07:00:00Z")
        );
        assert_eq!(
            s.next_after(utc("2026-11-01T06:10:00Z")).unwrap(),
            utc("2026-11-01T07:00:00Z")
        );
    }

    #[test]
    fn latest_between_matches_walking() {
        let cases = [
            (
                "*/30 * * * *",
                "America/New_York",
                "2026-11-01T04:10:00Z",
                "2026-11-01T06:50:00Z",
            ),
            (
                "*/15 * * * *",
                "America/New_York",
                "2026-03-08T06:00:00Z",
                "2026-03-08T07:05:00Z",
            ),
            (
                "* * * * * *",
                "Europe/London",
                "2026-10-25T00:59:00Z",
                "2026-10-25T01:00:30Z",
            ),
            (
                "0 9 * * *",
                "UTC",
                "2026-01-01T00:00:00Z",
                "2026-01-05T08:00:00Z",
            ),
        ];
        for (expr, tz, from, to) in cases {
            let s = Schedule::parse(expr, tz).unwrap();
            let walked = s.fires_between(utc(from), utc(to), 100_000).last().copied();
            assert_eq!(s.latest_between(utc(from), utc(to)), walked, "{expr} {tz}");
        }
        let s = Schedule::parse("0 9 * * *", "UTC").unwrap();
        assert_eq!(
            s.latest_between(utc("2026-01-01T09:00:00Z"), utc("2026-01-01T10:00:00Z")),
            None
        );
        // A year of every-second fires is not walked.
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(
            s.latest_between(utc("2025-01-01T00:00:00Z"), utc("2026-01-01T00:00:00.5Z")),
            Some(utc("2026-01-01T00:00:00Z"))
        );
    }
}

//! A queue's claim rate limit: a token bucket.
//!
//! The bucket holds at most `burst` tokens and refills continuously at `max_rate` tokens per
//! second; it starts full. Claiming `n` jobs takes `n` tokens *before* the claim is sent, and
//! a claim is never larger than the whole tokens in the bucket, so over any interval of
//! length `t` a queue claims at most `burst + max_rate × t` jobs per client. Tokens a claim did
//! not use (it came back short) are put back, capped at `burst`, which never leaves more than
//! the bucket would hold had only the claimed jobs been taken.

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub(crate) fn new(max_rate: f64, burst: u32, now: Instant) -> Self {
        TokenBucket {
            rate: max_rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now.max(self.at);
    }

    /// Whole tokens available now.
    pub(crate) fn available(&mut self, now: Instant) -> usize {
        self.refill(now);
        // Non-negative and at most `burst` (a u32), so the conversion is exact.
        self.tokens.floor().max(0.0) as usize
    }

    /// Take `n` tokens (at most [`available`](Self::available)).
    pub(crate) fn take(&mut self, n: usize, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens - n as f64).max(0.0);
    }

    /// Put back tokens a claim did not use.
    pub(crate) fn refund(&mut self, n: usize) {
        self.tokens = (self.tokens + n as f64).min(self.burst);
    }

    /// When the next whole token is there (now if one already is).
    pub(crate) fn next_token_at(&mut self, now: Instant) -> Instant {
        self.refill(now);
        let missing = 1.0 - self.tokens;
        if missing <= 0.0 {
            return now;
        }
        // rate >= the checked minimum (well above zero), so this is finite.
        now + std::time::Duration::from_secs_f64(missing / self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn starts_full_refills_at_the_rate_and_caps_at_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3, t0);
        assert_eq!(b.available(t0), 3);
        b.take(3, t0);
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.next_token_at(t0), t0 + Duration::from_millis(100));
        assert_eq!(b.available(t0 + Duration::from_millis(250)), 2);
        assert_eq!(b.available(t0 + Duration::from_secs(10)), 3);
        b.take(2, t0 + Duration::from_secs(10));
        b.refund(5);
        assert_eq!(b.available(t0 + Duration::from_secs(10)), 3);
    }

    #[test]
    fn takes_never_exceed_burst_plus_rate_times_elapsed() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(7.5, 4, t0);
        let mut taken = 0usize;
        for ms in (0..5000).step_by(13) {
            let now = t0 + Duration::from_millis(ms);
            let n = b.available(now);
            b.take(n, now);
            taken += n;
            let bound = 4.0 + 7.5 * (ms as f64 / 1000.0);
            assert!(taken as f64 <= bound + 1e-9, "{taken} > {bound} at {ms} ms");
        }
    }
}

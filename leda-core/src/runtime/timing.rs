//! What the runtime learns about a stage's calls from timing a few of them: their
//! typical length ([`CallAverage`], which decides how much queued work is worth a
//! second instance and what may run on a thread that read the events), and whether
//! its runs on such a thread stay short ([`HereBackoff`]).
//!
//! Neither may be decided for good by one call that took long for reasons of its own:
//! a first call doing lazy set-up (the average was set outright by its first sample),
//! or a run on a reading thread preempted on a busy host (one such run over a
//! millisecond used to move the stage's round trips to the pool for the process' life:
//! the transport bench's echo stage, under a busy loop on the other core, had one in
//! each of two one-second latency rounds, 1.1–3.2 ms).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A moving average of a stage's timed calls, in nanoseconds (`0`: none timed yet).
///
/// The first [`SEED`] samples set it to the shortest of them, so one slow first call
/// (lazy set-up) does not stand for the stage; after that it moves by an eighth of each
/// sample. Samples are not clipped: one sample in 64 is an unbiased sample of the calls,
/// and the average must stay their mean for stages whose long calls are few but carry
/// most of the work (95 % of calls at 200 ns and 5 % at 1 ms: a mean of 50 µs, which
/// splitting a backlog between instances needs; a first version that counted a sample
/// at most 32× the average read that stage as under 1 µs most of the time). The price:
/// one call preempted for a millisecond still reads as a long stage for a while (a
/// 2 µs stage over 50 µs for seven samples, ~450 calls), which only sends its work to
/// the pool.
pub(crate) struct CallAverage(AtomicU64);

/// Samples that seed the average (their minimum).
const SEED: u64 = 4;
/// The top bits count the seed samples; the rest is the average.
const COUNT_SHIFT: u32 = 61;
const NS_MASK: u64 = (1 << COUNT_SHIFT) - 1;
const _: () = assert!(SEED < 1 << (64 - COUNT_SHIFT));

impl CallAverage {
    pub(crate) const fn new() -> CallAverage {
        CallAverage(AtomicU64::new(0))
    }

    /// The average call in nanoseconds, `0` until one was timed.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed) & NS_MASK
    }

    /// Folds in a timed call of `ns` nanoseconds. (A lost update between two
    /// instances timing at once only delays the average a little.)
    pub(crate) fn add(&self, ns: u64) {
        let v = self.0.load(Relaxed);
        let (seen, old) = (v >> COUNT_SHIFT, v & NS_MASK);
        if ns == 0 && seen < SEED {
            // A clock coarser than the call says nothing about its length: a seed of
            // it would stand for every call.
            return;
        }
        let ns = ns.clamp(1, NS_MASK);
        let new = if seen == 0 {
            ns
        } else if seen < SEED {
            old.min(ns)
        } else {
            old - old / 8 + ns / 8
        };
        let seen = (seen + 1).min(SEED);
        self.0
            .store((seen << COUNT_SHIFT) | new.clamp(1, NS_MASK), Relaxed);
    }
}

/// A run on a thread that read the stage's events (see
/// [`super::Claimed::run`]) longer than this sends the stage's later activations to
/// the pool for a while: that thread's connection waited meanwhile.
const RUN_HERE_MAX: Duration = Duration::from_millis(1);
/// How long the first such run keeps the stage off reading threads; each further one
/// doubles it, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A stage whose last long run here is older than this starts again from
/// [`BACKOFF_FIRST`].
const FORGIVE_AFTER: Duration = Duration::from_secs(60);
/// The time off is at least this many times the long run's own length, whatever the
/// steps above say: long runs hold a reading thread up at most ~1 % of the time.
const OFF_PER_RUN: u32 = 100;

/// Whether a stage may run on a thread that read its events, after runs there that
/// took longer than [`RUN_HERE_MAX`]: not for [`BACKOFF_FIRST`] after the first, then
/// for twice as long after each further one up to [`BACKOFF_MAX`], and in any case for
/// [`OFF_PER_RUN`] times the run's own length. One preempted run costs a tenth of a
/// second of pool round trips instead of the rest of the process' life; a stage whose
/// runs here are often long holds a connection up once per time off (eight times in
/// the first 13 s, then once every ten seconds; before, once ever), and for at most
/// ~1 % of the time: a call of 1.5 s there keeps the stage off for 150 s. What bounds
/// a single run is the work the average lets it take (under 50 µs of it on average),
/// not this.
pub(crate) struct HereBackoff {
    /// Until when (see [`now_ns`]) the stage stays off; `0`: it may run here.
    until: AtomicU64,
    /// Long runs so far (since the last forgiven one).
    strikes: AtomicU32,
    /// When the last long run ended.
    last: AtomicU64,
}

impl HereBackoff {
    pub(crate) const fn new() -> HereBackoff {
        HereBackoff {
            until: AtomicU64::new(0),
            strikes: AtomicU32::new(0),
            last: AtomicU64::new(0),
        }
    }

    /// `true` when the stage may run here now. Reads the clock only while it is off.
    #[inline]
    pub(crate) fn allowed(&self) -> bool {
        let until = self.until.load(Relaxed);
        until == 0 || self.expired(until, now_ns())
    }

    #[cold]
    fn expired(&self, until: u64, now: u64) -> bool {
        if now < until {
            return false;
        }
        // (A long run recorded meanwhile keeps its own deadline.)
        let _ = self.until.compare_exchange(until, 0, Relaxed, Relaxed);
        true
    }

    /// A run here took `d`.
    #[inline]
    pub(crate) fn ran(&self, d: Duration) {
        if d > RUN_HERE_MAX {
            self.strike(now_ns(), d);
        }
    }

    #[cold]
    fn strike(&self, now: u64, took: Duration) {
        let last = self.last.swap(now, Relaxed);
        let strikes = if last != 0 && now.saturating_sub(last) > nanos(FORGIVE_AFTER) {
            self.strikes.store(1, Relaxed);
            1
        } else {
            self.strikes.fetch_add(1, Relaxed).saturating_add(1)
        };
        let off = nanos(BACKOFF_FIRST)
            .saturating_mul(1 << (strikes - 1).min(20))
            .min(nanos(BACKOFF_MAX))
            .max(nanos(took).saturating_mul(OFF_PER_RUN.into()));
        self.until.store(now.saturating_add(off).max(1), Relaxed);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds since the first call in this process, from `1` (`0` means "none").
fn now_ns() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    nanos(EPOCH.elapsed()).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_slow_first_call_does_not_stand_for_the_stage() {
        let avg = CallAverage::new();
        assert_eq!(avg.get(), 0, "nothing timed yet");
        avg.add(MS); // lazy set-up, or preempted
        assert_eq!(avg.get(), MS);
        for _ in 1..SEED {
            avg.add(2_000);
        }
        assert_eq!(
            avg.get(),
            2_000,
            "seeded by the shortest of the first samples"
        );
    }

    #[test]
    fn a_clock_coarser_than_the_call_does_not_seed_it() {
        let avg = CallAverage::new();
        avg.add(0);
        assert_eq!(avg.get(), 0, "a 0 ns sample is no seed");
        for _ in 0..SEED {
            avg.add(4 * MS);
        }
        avg.add(0);
        assert!(avg.get() > 3 * MS, "seeded: a 0 ns sample counts (as 1 ns)");
    }

    #[test]
    fn long_calls_that_are_few_but_carry_the_work_are_averaged_in_full() {
        // One call in 20 takes 1 ms, the others 200 ns: the mean is 50.19 µs. The
        // average's own mean over time is the calls' mean (a bound of 32× the average
        // on samples made it about 1 µs).
        let avg = CallAverage::new();
        let mut sum = 0;
        for i in 0..20_000u64 {
            avg.add(if i % 20 == 19 { MS } else { 200 });
            if i >= 10_000 {
                sum += avg.get();
            }
        }
        let mean = sum / 10_000;
        assert!((45_000..55_000).contains(&mean), "{mean} ns");
    }

    #[test]
    fn calls_that_became_slower_raise_the_average_at_once() {
        let avg = CallAverage::new();
        for _ in 0..SEED {
            avg.add(2_000);
        }
        avg.add(MS);
        assert!(avg.get() > 50_000, "one sample of 1 ms: {} ns", avg.get());
        let mut samples = 1;
        while avg.get() < MS / 2 {
            avg.add(MS);
            samples += 1;
        }
        assert!(
            samples <= 6,
            "{samples} samples of 1 ms to reach half of it"
        );
        for _ in 0..100 {
            avg.add(MS);
        }
        assert!(avg.get() > MS * 99 / 100, "{}", avg.get());
    }

    #[test]
    fn a_long_run_keeps_the_stage_off_for_a_while_doubling_up_to_a_cap() {
        let b = HereBackoff::new();
        assert!(b.allowed());
        b.ran(RUN_HERE_MAX); // not longer than the limit
        assert!(b.allowed());
        let t0 = 5 * MS;
        // Just over the limit: off for the first step (or a hundred such runs, which
        // is a little longer).
        let long = RUN_HERE_MAX + Duration::from_micros(1);
        b.strike(t0, long);
        let step = nanos(BACKOFF_FIRST);
        let first = step.max(nanos(long) * u64::from(OFF_PER_RUN));
        assert_eq!(first, 100_100_000);
        assert!(!b.expired(b.until.load(Relaxed), t0 + first - 1));
        assert!(b.expired(b.until.load(Relaxed), t0 + first));
        assert_eq!(
            b.until.load(Relaxed),
            0,
            "allowed again: the clock is not read"
        );
        let mut off = Vec::new();
        let mut now = t0 + first;
        for _ in 0..10 {
            b.strike(now, long);
            let until = b.until.load(Relaxed);
            off.push(until - now);
            now = until;
        }
        assert_eq!(off[0], 2 * step);
        assert_eq!(off[1], 4 * step);
        assert_eq!(*off.last().unwrap(), nanos(BACKOFF_MAX));
        // A minute without a long run: the next one is forgiven back to the first step.
        b.expired(b.until.load(Relaxed), now);
        let later = now + nanos(FORGIVE_AFTER) + 1;
        b.strike(later, long);
        assert_eq!(b.until.load(Relaxed) - later, first);
        // A very long run keeps it off for a hundred times its length.
        let now = later + first;
        b.strike(now, Duration::from_millis(1500));
        assert_eq!(b.until.load(Relaxed) - now, 150 * 1_000 * MS);
    }

    #[test]
    fn the_real_clock_lets_a_stage_back_after_its_time_off() {
        let b = HereBackoff::new();
        b.ran(Duration::from_millis(2));
        assert!(!b.allowed(), "off right after a long run");
        // (Off for 200 ms: a hundred times the run.)
        std::thread::sleep(Duration::from_millis(220));
        assert!(b.allowed(), "back after 200 ms");
    }
}

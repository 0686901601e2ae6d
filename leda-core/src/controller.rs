//! Controllers: observe statistics snapshots at an interval and steer the process —
//! worker threads, `maxpar` and queue capacities.
//!
//! * [`Fixed`]: a fixed pool (the original Leda's `thread_pool.get(n)`).
//! * [`Auto`]: sizes the pool from measured demand (below).
//!
//! # The automatic policy
//!
//! Every tick (100 ms) [`Auto`] computes, per stage, the offered load λ (events
//! accepted plus events refused for a full queue, per second) and the worker time per
//! event S (time workers spent running the stage divided by events handled, averaged
//! with the previous tick's S, since worker time is sampled). By
//! Little's law the stage keeps λ·S workers busy; a queue backlog B adds B·S / 1 s so
//! that it drains within about a second. The target pool is `ceil(1.1 · Σ λ·S + Σ B·S)`,
//! clamped to `[min, max]`. The pool grows to the target at once when the target is
//! above it (backlogged stages with every worker busy or blocked), and shrinks by one
//! thread per tick only after the target has stayed two or more threads below the pool
//! for five ticks in a row (idle workers), so a steady load holds the pool within ±1.
//! Time a handler spends *waiting* on a future is not worker time and does not count.
//!
//! Worker time is measured only for the calls that end, one in 64: a few calls that
//! block or run for seconds go unmeasured (200 calls of 2 s kept a pool of 2 at 2, a
//! review found, and its other stages starved). So when every worker is busy and tasks
//! wait for one, at a tick and the tick before, and fewer calls ended in the tick than
//! there are workers (calls outlast the tick), the pool grows by half (at least one
//! thread) whatever the measured demand says. (Busy workers and waiting tasks alone are
//! no sign: a pool sized right for short calls shows both most of the time.)

use std::time::Duration;

use crate::runtime::apply_auto_maxpar;
use crate::runtime::process::Process;
use crate::stats::Snapshot;

/// A refused control action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// No stage of this process has that name.
    #[error("no stage named '{0}' in this process")]
    UnknownStage(String),
    /// Serial stages have exactly one instance.
    #[error("stage '{0}' is serial: its maxpar is always 1")]
    Serial(String),
}

/// What a controller may change.
pub struct Knobs<'a> {
    process: &'a Process,
    run_maxpar: bool,
}

impl<'a> Knobs<'a> {
    pub(crate) fn new(process: &'a Process, run_maxpar: bool) -> Self {
        Knobs {
            process,
            run_maxpar,
        }
    }

    /// Worker threads now.
    pub fn threads(&self) -> usize {
        self.process.exec.threads()
    }

    /// Resizes the worker pool (at least one thread). Stages without an explicit
    /// `maxpar` follow the thread count.
    pub fn set_threads(&mut self, n: usize) {
        let n = n.max(1);
        self.process.exec.set_threads(n);
        apply_auto_maxpar(self.process, n, self.run_maxpar);
    }

    /// Sets the instance limit of a parallel stage.
    pub fn set_maxpar(&mut self, stage: &str, n: usize) -> Result<(), ControlError> {
        let st = self.stage(stage)?;
        if st.serial {
            return Err(ControlError::Serial(stage.to_owned()));
        }
        st.maxpar
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Sets the event-queue capacity of a stage (events already queued stay).
    pub fn set_capacity(&mut self, stage: &str, n: usize) -> Result<(), ControlError> {
        self.stage(stage)?
            .capacity
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn stage(&self, name: &str) -> Result<&crate::runtime::process::StageRt, ControlError> {
        self.process
            .stage_index(name)
            .map(|i| &self.process.stages[i])
            .ok_or_else(|| ControlError::UnknownStage(name.to_owned()))
    }
}

/// Observes snapshots and steers the process.
pub trait Controller: Send {
    /// Threads to start with.
    fn initial_threads(&self) -> usize;
    /// Time between ticks (at least a millisecond is waited).
    fn interval(&self) -> Duration {
        Duration::from_millis(100)
    }
    /// Called once the pool is up, before any event is handled.
    fn start(&mut self, _knobs: &mut Knobs<'_>) {}
    /// Called every interval with a fresh snapshot (throughputs against the last tick).
    fn tick(&mut self, snapshot: &Snapshot, knobs: &mut Knobs<'_>);
}

/// A fixed pool of `n` threads.
#[derive(Debug, Clone)]
pub struct Fixed(usize);

impl Fixed {
    /// `n` threads (at least one).
    pub fn new(n: usize) -> Fixed {
        Fixed(n.max(1))
    }
}

/// `fixed(n)`: a fixed pool of `n` threads.
pub fn fixed(n: usize) -> Fixed {
    Fixed::new(n)
}

impl Controller for Fixed {
    fn initial_threads(&self) -> usize {
        self.0
    }
    fn interval(&self) -> Duration {
        Duration::from_secs(3600)
    }
    fn tick(&mut self, _: &Snapshot, _: &mut Knobs<'_>) {}
}

/// The largest pool a process runs: 64 threads, or 4 per CPU on a larger machine. The
/// automatic controller's default ceiling, the dashboard's bound and the commands'
/// `--threads` bound ([`crate::cli::thread_count`]). Thousands of threads are no
/// setting: every idle worker looks at the others, and a review measured 3,000 log
/// lines take 48 s on a pool of 1,000.
pub fn max_threads() -> usize {
    64.max(4 * num_cpus::get())
}

/// The automatic controller (policy in the module docs).
#[derive(Debug, Clone)]
pub struct Auto {
    min: usize,
    max: usize,
    prev: Option<Snapshot>,
    /// Last known worker time per event, per stage (seconds).
    service: Vec<f64>,
    low_ticks: u32,
}

impl Default for Auto {
    fn default() -> Self {
        Auto::new(num_cpus::get(), max_threads())
    }
}

impl Auto {
    /// Between `min` and `max` threads.
    pub fn new(min: usize, max: usize) -> Auto {
        let min = min.max(1);
        Auto {
            min,
            max: max.max(min),
            prev: None,
            service: Vec::new(),
            low_ticks: 0,
        }
    }

    /// The thread count the policy wants for `snap`, given the previous snapshot.
    fn target(&mut self, snap: &Snapshot, prev: &Snapshot) -> usize {
        let dt = snap.time - prev.time;
        if dt <= 0.0 {
            return snap.process.threads;
        }
        self.service.resize(snap.stages.len(), 0.0);
        let mut demand = 0.0;
        for (i, (s, p)) in snap.stages.iter().zip(&prev.stages).enumerate() {
            let handled = s.handled.saturating_sub(p.handled);
            let busy = (s.busy_s - p.busy_s).max(0.0);
            if handled > 0 {
                // Smoothed: worker time is sampled, and one slow sample (a preempted
                // worker, an oversleeping handler) must not double the pool.
                let now = busy / handled as f64;
                let old = self.service[i];
                self.service[i] = if old > 0.0 { 0.5 * (old + now) } else { now };
            }
            let offered = (s.events_in.saturating_sub(p.events_in)
                + s.rejected.saturating_sub(p.rejected)) as f64
                / dt;
            let svc = self.service[i];
            demand += 1.1 * offered * svc + s.queue_len as f64 * svc;
        }
        (demand.ceil() as usize).clamp(self.min, self.max)
    }
}

/// Every worker was busy and tasks waited for one.
fn saturated(s: &Snapshot) -> bool {
    s.process.busy_threads >= s.process.threads && s.process.ready_queue > 0
}

impl Controller for Auto {
    fn initial_threads(&self) -> usize {
        self.min
    }

    fn tick(&mut self, snap: &Snapshot, knobs: &mut Knobs<'_>) {
        let Some(prev) = self.prev.take() else {
            self.prev = Some(snap.clone());
            return;
        };
        let threads = knobs.threads();
        let mut target = self.target(snap, &prev);
        let ended: u64 = snap
            .stages
            .iter()
            .zip(&prev.stages)
            .map(|(s, p)| s.handled.saturating_sub(p.handled))
            .sum();
        if saturated(snap) && saturated(&prev) && ended < threads as u64 {
            target = target.max((threads + (threads / 2).max(1)).min(self.max));
        }
        if target > threads {
            knobs.set_threads(target);
            self.low_ticks = 0;
        } else if target + 2 <= threads {
            self.low_ticks += 1;
            if self.low_ticks >= 5 {
                knobs.set_threads(threads - 1);
                self.low_ticks = 0;
            }
        } else {
            self.low_ticks = 0;
        }
        self.prev = Some(snap.clone());
    }
}

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
//! review found, and its other stages starved). So when every worker is busy and as much
//! work waits as there are workers (tasks for a worker, events in queues) at a tick and
//! the tick before, and the busy workers were mostly off the CPU meanwhile (the process
//! used less than half of the CPU time they, or the host's CPUs if fewer, could have:
//! they sleep or wait on I/O), the pool grows by half (at least one thread) whatever the
//! measured demand says. (Busy workers and waiting work alone are no sign: computing workers show both,
//! and more threads than CPUs would not help them.) Conversely, while the busy workers
//! compute (at least half that CPU time used), the pool does not grow past the host's
//! CPUs, whatever the backlog: a backlog of 5 ms computations grew a 2-CPU pool to 64.

use std::sync::Arc;
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
    process: &'a Arc<Process>,
    run_maxpar: bool,
}

impl<'a> Knobs<'a> {
    pub(crate) fn new(process: &'a Arc<Process>, run_maxpar: bool) -> Self {
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
        let before = self.process.exec.threads();
        self.process.exec.set_threads(n);
        apply_auto_maxpar(self.process, n, self.run_maxpar);
        if !self.run_maxpar {
            for (i, st) in self.process.stages.iter().enumerate() {
                if st.maxpar_auto {
                    self.start_instances(i, before, n);
                }
            }
        }
    }

    /// A stage's `maxpar` went from `before` to `now`: the instances it allows now are
    /// started for events already queued (otherwise only a new event, or a call that
    /// ends, would start one: a pool grown for blocking calls stayed unused).
    fn start_instances(&self, stage: usize, before: usize, now: usize) {
        for _ in before..now {
            self.process.activate(stage);
        }
    }

    /// Sets the instance limit of a parallel stage.
    pub fn set_maxpar(&mut self, stage: &str, n: usize) -> Result<(), ControlError> {
        let i = self.index(stage)?;
        let st = &self.process.stages[i];
        if st.serial {
            return Err(ControlError::Serial(stage.to_owned()));
        }
        let before = st
            .maxpar
            .swap(n.max(1), std::sync::atomic::Ordering::Relaxed);
        self.start_instances(i, before, n);
        Ok(())
    }

    /// Sets the event-queue capacity of a stage (events already queued stay).
    pub fn set_capacity(&mut self, stage: &str, n: usize) -> Result<(), ControlError> {
        self.process.stages[self.index(stage)?]
            .capacity
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn index(&self, name: &str) -> Result<usize, ControlError> {
        self.process
            .stage_index(name)
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
    /// The host's CPUs (read once: `num_cpus` reads the cgroup's quota files).
    cpus: usize,
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
            cpus: num_cpus::get(),
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

/// Every worker was busy and at least as much work waited — tasks for a worker, events
/// in queues — as there are workers (a pool sized right for short calls sees a little
/// waiting work most of the time).
fn saturated(s: &Snapshot) -> bool {
    let waiting = s.process.ready_queue + s.stages.iter().map(|st| st.queue_len).sum::<usize>();
    s.process.busy_threads >= s.process.threads && waiting >= s.process.threads
}

/// Whether the busy workers spent most of the time from `prev` to `snap` off the CPU:
/// the process used less than half of the CPU time they (or the host's `cpus`, if
/// fewer) could have. `None` where CPU time is not known, or no worker was busy.
fn off_cpu(snap: &Snapshot, prev: &Snapshot, cpus: usize) -> Option<bool> {
    let dt = snap.time - prev.time;
    let busy = snap.process.busy_threads.min(cpus);
    if dt <= 0.0 || snap.process.cpu_s <= 0.0 || busy == 0 {
        return None;
    }
    let used = snap.process.cpu_s - prev.process.cpu_s;
    Some(used < 0.5 * busy as f64 * dt)
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
        let cpus = self.cpus;
        let waiting = off_cpu(snap, &prev, cpus);
        if saturated(snap) && saturated(&prev) && waiting == Some(true) {
            target = target.max((threads + (threads / 2).max(1)).min(self.max));
        }
        // More threads than CPUs help only workers that wait: computing ones are not
        // given more (a backlog of 5 ms computations grew a 2-CPU pool to 64).
        if waiting == Some(false) && target > threads.max(cpus) {
            target = threads.max(cpus).max(self.min);
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

//! The executor seam: what the process runtime needs from whoever runs its tasks.
//!
//! The real executor is the worker pool (`pool`). A deterministic simulated
//! executor (virtual time, seeded, one thread) implements the same trait to run the same
//! graph; the process runtime above it does not change.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Rejected;
use crate::event::Event;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs tasks and provides time.
pub trait Executor: Send + Sync + 'static {
    /// Makes `task` ready: it will be run once by some worker.
    fn schedule(&self, task: super::Task);
    /// Seconds since the Unix epoch (virtual in simulation).
    fn now(&self) -> f64;
    /// A future that completes after `d` (virtual in simulation).
    fn sleep(&self, d: Duration) -> BoxFuture<()>;
    /// Worker threads now.
    fn threads(&self) -> usize;
    /// Asks for `n` worker threads (ignored by single-threaded executors).
    fn set_threads(&self, n: usize);
    /// Threads running a task now.
    fn busy_threads(&self) -> usize;
    /// Tasks waiting to run.
    fn ready_len(&self) -> usize;
    /// `true` when the calling worker has nothing else to run, so an instance that
    /// just emptied its queue may spin briefly for more events instead of releasing
    /// (re-activation costs more than a short spin). Single-threaded executors say no.
    fn may_spin(&self) -> bool {
        false
    }
    /// Makes `task` ready after it yielded with work left: it should run after the
    /// tasks already ready (round robin), so its queue fills meanwhile. By default,
    /// the same as [`Executor::schedule`].
    fn schedule_yielded(&self, task: super::Task) {
        self.schedule(task);
    }
    /// Makes `task` ready after it yielded with [`crate::runtime::Ctx::nice`]: behind
    /// the tasks ready now in the whole pool, and behind what the reactor makes ready
    /// before the calling worker's next pick. By default, the same as
    /// [`Executor::schedule_yielded`].
    fn schedule_niced(&self, task: super::Task) {
        self.schedule_yielded(task);
    }
    /// `true` when other tasks are ready to run on the calling worker, so an instance
    /// that got only a short batch should rather yield than wait for its queue to
    /// fill. Single-threaded executors may say no.
    fn others_ready(&self) -> bool {
        false
    }
    /// The calling task is about to hand off work it will most likely run itself next
    /// (the output of its last batch, just before it ends): tasks scheduled until
    /// [`Executor::end_handoff`] need not wake another worker while this worker's own
    /// queue was empty. By default nothing is deferred.
    fn begin_handoff(&self) {}
    /// Runs `task` on the calling thread, which is none of this executor's workers
    /// (a transport's reader delivering short work: [`super::Claimed`]), with
    /// whatever context a worker would give it. By default, `task.run()`.
    fn run_here(&self, task: super::Task) {
        task.run();
    }
    /// Ends [`Executor::begin_handoff`]: `continuing` if the calling task goes on
    /// running (then the wake-ups it deferred are made now), else it ends and this
    /// worker runs what it scheduled.
    fn end_handoff(&self, continuing: bool) {
        let _ = continuing;
    }
}

/// Where events for a stage of another process go (implemented by leda-net and by the
/// simulator). One sink serves one destination stage.
pub trait RemoteSink: Send + Sync + 'static {
    /// Hands `event` to the transport. An error means the event was not taken, and
    /// hands it back.
    fn send(&self, event: Event) -> Result<(), Rejected>;
    /// [`RemoteSink::send`] from a running task, which calls [`RemoteSink::flush`]
    /// when its batch ends: the transport may hold the event until then (to write
    /// the batch on the sending worker instead of waking a writer thread per batch).
    /// It must not hold it indefinitely when refusing later sends for want of room.
    /// By default, `send`.
    fn send_held(&self, event: Event) -> Result<(), Rejected> {
        self.send(event)
    }
    /// Events taken but not yet acknowledged by the peer (for idle detection).
    fn in_flight(&self) -> u64 {
        0
    }
    /// After a `QueueFull`: a future that completes when this sink may take events
    /// again (the peer returned credit), so that a waiting sender retries at once
    /// rather than after a back-off. It may complete early (the sender just retries),
    /// and the core still retries after its short back-off if that comes first.
    /// `None` (the default): the back-off alone.
    fn room(&self) -> Option<BoxFuture<()>> {
        None
    }
    /// Called on the sending worker when the running task that sent to this sink
    /// ([`RemoteSink::send_held`]) finishes a batch of its input, starts a wait, ends,
    /// or calls `Ctx::flush` (when its local sends are pushed too): a transport may
    /// write what the task sent itself then, rather than leave it to another thread.
    /// It must not send events or run handlers. By default nothing.
    fn flush(&self) {}
}

/// Builds remote sinks when a run starts: one per connector whose destination runs
/// in another process.
pub trait RemoteLinks: Send + Sync + 'static {
    /// A sink for events that stage `from` sends to stage `to`, which runs in cluster
    /// `cluster` (0-based), mapped to `processes`.
    fn sink(
        &self,
        from: &str,
        to: &str,
        cluster: usize,
        processes: &[String],
    ) -> Result<Arc<dyn RemoteSink>, String>;

    /// Statistics of the other processes of the run, for an aggregating dashboard
    /// ([`crate::dashboard`]); none by default.
    fn peer_stats(&self) -> Vec<crate::dashboard::PeerStats> {
        Vec::new()
    }

    /// The outcomes of the events sent on each remote route so far; none by default.
    fn route_counts(&self) -> Vec<crate::stats::RouteCounts> {
        Vec::new()
    }

    /// Applies a dashboard control action in the process `process`; unsupported by
    /// default.
    fn peer_control(
        &self,
        process: &str,
        action: &crate::dashboard::Control,
    ) -> Result<(), String> {
        let _ = action;
        Err(format!("process {process} cannot be controlled from here"))
    }
}

//! The real executor: one shared worker pool per process over one ready queue, plus the
//! asynchronous-events thread (a tokio reactor: timers, sockets) that wakes waiting
//! instances.
//!
//! Workers enter the reactor's context, so a handler may create tokio sockets and
//! timers; the futures are polled by the workers and the reactor only wakes them.
//! Resizing follows the original Leda: growing spawns threads, shrinking queues one stop
//! sentinel per thread to remove.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};

use super::Task;
use super::executor::{BoxFuture, Executor};

enum Job {
    Run(Task),
    Stop,
}

struct Shared {
    tx: Sender<Job>,
    rx: Receiver<Job>,
    busy: AtomicUsize,
    io: tokio::runtime::Handle,
}

/// The worker pool.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: Mutex<(usize, Vec<JoinHandle<()>>)>,
}

impl Pool {
    pub(crate) fn new(io: tokio::runtime::Handle) -> Pool {
        let (tx, rx) = crossbeam_channel::unbounded();
        Pool {
            shared: Arc::new(Shared { tx, rx, busy: AtomicUsize::new(0), io }),
            threads: Mutex::new((0, Vec::new())),
        }
    }

    /// Stops every worker and drops the tasks still queued.
    pub(crate) fn shutdown(&self) {
        self.set_threads(0);
        let handles = {
            let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut t.1)
        };
        for h in handles {
            let _ = h.join();
        }
        while self.shared.rx.try_recv().is_ok() {}
    }
}

fn worker(shared: Arc<Shared>) {
    let _io = shared.io.enter();
    while let Ok(job) = shared.rx.recv() {
        match job {
            Job::Run(task) => {
                shared.busy.fetch_add(1, Relaxed);
                task.run();
                shared.busy.fetch_sub(1, Relaxed);
            }
            Job::Stop => break,
        }
    }
}

impl Executor for Pool {
    #[inline]
    fn schedule(&self, task: Task) {
        // Fails only after shutdown, when the task is meant to be dropped.
        let _ = self.shared.tx.send(Job::Run(task));
    }

    fn now(&self) -> f64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
    }

    fn sleep(&self, d: Duration) -> BoxFuture<()> {
        let _g = self.shared.io.enter();
        Box::pin(tokio::time::sleep(d))
    }

    fn threads(&self) -> usize {
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn set_threads(&self, n: usize) {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        while t.0 < n {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("leda-worker-{}", t.1.len()))
                .spawn(move || worker(shared));
            match spawned {
                Ok(h) => {
                    t.1.push(h);
                    t.0 += 1;
                }
                Err(e) => {
                    tracing::error!(error = %e, threads = t.0, "cannot start a worker thread");
                    break;
                }
            }
        }
        while t.0 > n {
            let _ = self.shared.tx.send(Job::Stop);
            t.0 -= 1;
        }
        t.1.retain(|h| !h.is_finished());
    }

    fn busy_threads(&self) -> usize {
        self.shared.busy.load(Relaxed)
    }

    fn ready_len(&self) -> usize {
        self.shared.rx.len()
    }
}

/// The asynchronous-events thread: a current-thread tokio runtime driving timers and
/// sockets until dropped.
pub(crate) struct Io {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Io {
    pub(crate) fn start() -> std::io::Result<Io> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("leda-events".into()).spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            });
        })?;
        Ok(Io { handle, stop: Some(stop), thread: Some(thread) })
    }

    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

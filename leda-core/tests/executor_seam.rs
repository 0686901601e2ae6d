//! The executor seam: the same graph runs on a deterministic, single-threaded executor
//! with virtual time (the shape of the simulator the lock-service work builds).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use leda_core::prelude::*;
use leda_core::runtime::Task;
use leda_core::runtime::executor::{BoxFuture, Executor};

/// One thread, FIFO ready queue, virtual clock that jumps to the next timer when idle.
#[derive(Default)]
struct Sim {
    ready: Mutex<VecDeque<Task>>,
    clock: Arc<Mutex<Clock>>,
}

#[derive(Default)]
struct Clock {
    now_ns: u64,
    seq: u64,
    timers: BinaryHeap<Reverse<(u64, u64)>>,
    wakers: Vec<(u64, Waker)>,
}

struct SimSleep {
    clock: Arc<Mutex<Clock>>,
    deadline: u64,
    id: Option<u64>,
}

impl Future for SimSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let clock = self.clock.clone();
        let mut c = clock.lock().unwrap();
        if c.now_ns >= self.deadline {
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                c.seq += 1;
                let id = c.seq;
                c.timers.push(Reverse((self.deadline, id)));
                self.id = Some(id);
                id
            }
        };
        c.wakers.retain(|(i, _)| *i != id);
        c.wakers.push((id, cx.waker().clone()));
        Poll::Pending
    }
}

impl Executor for Sim {
    fn schedule(&self, task: Task) {
        self.ready.lock().unwrap().push_back(task);
    }
    fn now(&self) -> f64 {
        self.clock.lock().unwrap().now_ns as f64 / 1e9
    }
    fn sleep(&self, d: Duration) -> BoxFuture<()> {
        let deadline = self.clock.lock().unwrap().now_ns + d.as_nanos() as u64;
        Box::pin(SimSleep {
            clock: self.clock.clone(),
            deadline,
            id: None,
        })
    }
    fn threads(&self) -> usize {
        1
    }
    fn set_threads(&self, _: usize) {}
    fn busy_threads(&self) -> usize {
        0
    }
    fn ready_len(&self) -> usize {
        self.ready.lock().unwrap().len()
    }
}

impl Sim {
    /// Runs ready tasks; when none is left, advances virtual time to the next timer.
    fn drive(&self) {
        loop {
            let task = self.ready.lock().unwrap().pop_front();
            if let Some(t) = task {
                t.run();
                continue;
            }
            let waker = {
                let mut c = self.clock.lock().unwrap();
                let Some(Reverse((deadline, id))) = c.timers.pop() else {
                    return;
                };
                c.now_ns = c.now_ns.max(deadline);
                let i = c.wakers.iter().position(|(w, _)| *w == id);
                i.map(|i| c.wakers.swap_remove(i).1)
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

fn simulate() -> (Vec<(u64, i64)>, Duration, bool) {
    let trace = Arc::new(Mutex::new(Vec::new()));
    let test_thread = std::thread::current().id();
    let only_this_thread = Arc::new(Mutex::new(true));
    let (t2, o2) = (trace.clone(), only_this_thread.clone());
    // Five events, each delayed by (5 - i) * 100 virtual seconds, then logged.
    let delay = Stage::asynchronous("delay", |ev: Event, mut ctx: Ctx| async move {
        let i: i64 = ev.get(0)?;
        ctx.sleep(Duration::from_secs(100 * (5 - i) as u64)).await;
        ctx.send_wait(1, i).await?;
        Ok(())
    })
    .maxpar(5);
    let log = Stage::new("log", move |ev: Event, ctx: &mut Ctx| {
        if std::thread::current().id() != test_thread {
            *o2.lock().unwrap() = false;
        }
        t2.lock()
            .unwrap()
            .push((ctx.gettime() as u64, ev.get::<i64>(0)?));
        Ok(())
    })
    .serial();
    for i in 0..5 {
        delay.push(i);
    }
    let mut g = Graph::new("sim");
    g.connect(&delay, 1, &log);
    let sim = Arc::new(Sim::default());
    let started = Instant::now();
    let running = g.start(Run::default().executor(sim.clone())).unwrap();
    sim.drive();
    let h = running.handle();
    assert!(
        h.is_quiescent(),
        "the simulator drained every task and timer"
    );
    h.quit(());
    let report = running.wait().unwrap();
    assert_eq!(report.stats.stage("log").unwrap().handled, 5);
    let trace = trace.lock().unwrap().clone();
    let only = *only_this_thread.lock().unwrap();
    (trace, started.elapsed(), only)
}

#[test]
fn a_graph_runs_deterministically_on_a_virtual_time_executor() {
    let (trace, _real, one_thread) = simulate();
    // The handlers saw virtual time: 500 s of sleeping, no real waiting.
    assert_eq!(
        trace,
        vec![(100, 4), (200, 3), (300, 2), (400, 1), (500, 0)]
    );
    assert!(one_thread, "every handler ran on the driving thread");
    let (again, _, _) = simulate();
    assert_eq!(trace, again, "same executor, same trace");
}

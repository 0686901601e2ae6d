//! The stage kinds of the sort application, and the registry that lets every
//! process (launcher or daemon: the same binary) rebuild them by name.
//!
//! Events:
//! * scatter → `sortK`: `(part: bytes, t0: float, k: int)`, part `k` (0-based) of the
//!   input as little-endian doubles, `t0` the start of the timing window;
//! * `sortK` → reducer: the same, sorted;
//! * reducer: quits with `(seconds: float, ok: bool, sorted: bytes)`, `ok` when the
//!   parts put together are exactly `1, 2, …, length`;
//! * communication test: sender → sink `(vector: bytes)`, sink → sender
//!   `("ack", bytes received)`; the sender quits with the round times (seconds).

use std::time::Instant;

use bytes::Bytes;
use leda_core::prelude::*;
use leda_net::Registry;

use crate::kernel::Kernel;
use crate::vector;

/// Kind (and default name) of the scatter stage.
pub const SCATTER: &str = "sort.scatter";
/// Kind of the sort stage (its clones are named `sort1` … `sortp`).
pub const SORT: &str = "sort.sort";
/// Kind (and default name) of the reducer.
pub const REDUCER: &str = "sort.reducer";
/// Kind of the communication test's sender.
pub const SEND: &str = "sort.send";
/// Kind of the communication test's receiver.
pub const SINK: &str = "sort.sink";

fn usize_attr(a: &Attrs, key: &str) -> Result<usize, BoxError> {
    let v: u64 = a
        .get_as(key)
        .map_err(|e| format!("attribute '{key}': {e}"))?;
    usize::try_from(v).map_err(|_| format!("attribute '{key}' = {v} is too large").into())
}

struct Scatter {
    np: usize,
    length: usize,
    /// The parts sent (kept to send a lost one again) and when.
    parts: Vec<Bytes>,
    t0: f64,
    /// Sort stages whose process was lost (by port, 1-based).
    lost: Vec<bool>,
    /// The parts sent to each sort stage (by port), its own and any sent again to it.
    holds: Vec<Vec<usize>>,
}

/// The quit value of a sort that cannot finish: `("failed", why)`.
pub const FAILED: &str = "failed";

/// Scatter (Listing B.4): on its start event, builds the `length`-double input, starts
/// the clock and sends part `k` on port `k + 1`, for `k` in `0..np` (attributes `np`,
/// `length`). Told that the process of cluster `c` (stage `sort{c}`) was lost — the run
/// goes on (`OnProcessLoss::Continue`) and names this stage to notify — it sends every
/// part it had sent to that stage (its own, and any sent again to it) to the next sort
/// stage whose process lives: what the lost process had queued or was sorting died
/// with it. With none left, it ends the run with `("failed", why)`.
pub fn scatter() -> Stage {
    Stage::stateful(
        SCATTER,
        |a: &Attrs| -> Result<Scatter, BoxError> {
            let (np, length) = (usize_attr(a, "np")?, usize_attr(a, "length")?);
            vector::part_len(length, np)?;
            Ok(Scatter {
                np,
                length,
                parts: Vec::new(),
                t0: 0.0,
                lost: vec![false; np + 1],
                holds: vec![Vec::new(); np + 1],
            })
        },
        |st: &mut Scatter, ev: Event, ctx: &mut Ctx| {
            if ev.get::<&str>(0)? == "process_lost" {
                let cluster: i64 = ev.get(2)?;
                let Some(port) = usize::try_from(cluster)
                    .ok()
                    .filter(|&c| (1..=st.np).contains(&c))
                else {
                    return Ok(());
                };
                st.lost[port] = true;
                for k in std::mem::take(&mut st.holds[port]) {
                    st.send_again(k, ctx)?;
                }
                return Ok(());
            }
            // Initialisation: outside the timing window.
            st.parts = (0..st.np)
                .map(|k| vector::input_part(st.length, st.np, k).map(|p| vector::to_bytes(&p)))
                .collect::<Result<Vec<Bytes>, _>>()?;
            st.t0 = ctx.gettime();
            for k in 0..st.np {
                // A stage whose process is lost already (told before the start, or found
                // unreachable now): its part goes to the next one that lives.
                if st.lost[k + 1] {
                    st.send_again(k, ctx)?;
                    continue;
                }
                match ctx.send_or_wait(k + 1, (st.parts[k].clone(), st.t0, k as i64)) {
                    Ok(()) => st.holds[k + 1].push(k),
                    Err(SendError::Unreachable { .. }) => {
                        st.lost[k + 1] = true;
                        st.send_again(k, ctx)?;
                    }
                    Err(e) => return unsendable(k, e, ctx),
                }
            }
            Ok(())
        },
    )
    .serial()
    .kind(SCATTER)
}

impl Scatter {
    /// Sends part `k` to the next sort stage after its own whose process lives; with
    /// none left, ends the run as failed.
    fn send_again(&mut self, k: usize, ctx: &mut Ctx) -> HandlerResult {
        let Some(part) = self.parts.get(k).cloned() else {
            return Ok(()); // (a loss told before the start: nothing was sent)
        };
        for p in (1..=self.np).map(|i| (k + i) % self.np + 1) {
            if self.lost[p] {
                continue;
            }
            match ctx.send_or_wait(p, (part.clone(), self.t0, k as i64)) {
                Ok(()) => {
                    tracing::warn!(part = k, to = p, "sending a lost part again");
                    self.holds[p].push(k);
                    return Ok(());
                }
                Err(SendError::Unreachable { .. }) => self.lost[p] = true,
                Err(e) => return unsendable(k, e, ctx),
            }
        }
        ctx.quit((FAILED, format!("no sort process left for part {k}")));
        Ok(())
    }
}

/// Part `k` could not be sent for a reason of its own (`Unsendable`: too large for a
/// frame), which no other process would change: the run ends as failed, saying why.
/// Other errors fail the call.
fn unsendable(k: usize, e: SendError, ctx: &mut Ctx) -> HandlerResult {
    match e {
        SendError::Unsendable { reason, .. } => {
            ctx.quit((FAILED, format!("part {k} cannot be sent: {reason}")));
            Ok(())
        }
        e => Err(e.into()),
    }
}

/// Sort (Listing B.4's "Executa operacao"): sorts the part with Listing B.2 (attribute
/// `kernel`: `"c"`, the default, or `"rust"`) and sends it on, with its other
/// arguments, on port 1.
pub fn sorter() -> Stage {
    Stage::stateful(
        SORT,
        |a: &Attrs| -> Result<Kernel, BoxError> {
            Ok(match a.get_as::<Option<String>>("kernel")? {
                Some(k) => k.parse()?,
                None => Kernel::default(),
            })
        },
        |kernel: &mut Kernel, mut ev: Event, ctx: &mut Ctx| {
            let part = ev.take(0);
            let bytes = part
                .as_bytes()
                .ok_or_else(|| format!("expected a vector of doubles, got {}", part.type_name()))?;
            let mut v = vector::from_bytes(bytes)?;
            kernel.sort(&mut v)?;
            let mut out = Event::from(vector::to_bytes(&v));
            for a in ev.args().iter().skip(1) {
                out.push(a.clone());
            }
            ctx.send_or_wait(1, out)?;
            Ok(())
        },
    )
    .kind(SORT)
}

struct Reduce {
    np: usize,
    length: usize,
    /// Sorted parts by index (a part sent again after a loss may arrive twice).
    parts: std::collections::BTreeMap<i64, Vec<f64>>,
}

/// Reducer (serial): collects the `np` sorted parts; when the last arrives, stops the
/// clock, checks the result and quits with `(seconds, ok, sorted vector)`.
pub fn reducer() -> Stage {
    Stage::stateful(
        REDUCER,
        |a: &Attrs| -> Result<Reduce, BoxError> {
            Ok(Reduce {
                np: usize_attr(a, "np")?,
                length: usize_attr(a, "length")?,
                parts: Default::default(),
            })
        },
        |st: &mut Reduce, ev: Event, ctx: &mut Ctx| {
            let part = ev
                .arg(0)
                .and_then(Value::as_bytes)
                .ok_or("expected a sorted part (bytes)")?;
            let t0: f64 = ev.get(1)?;
            let k: i64 = ev.get(2)?;
            st.parts.insert(k, vector::from_bytes(part)?);
            if st.parts.len() < st.np {
                return Ok(());
            }
            let secs = ctx.gettime() - t0;
            // Outside the window: put the parts in order and check them.
            let parts = std::mem::take(&mut st.parts);
            let mut parts: Vec<Vec<f64>> = parts.into_values().collect();
            parts.sort_by(|a, b| {
                a.first()
                    .unwrap_or(&0.0)
                    .total_cmp(b.first().unwrap_or(&0.0))
            });
            let all: Vec<f64> = parts.into_iter().flatten().collect();
            let ok = vector::is_sorted_and_complete(&all, st.length);
            ctx.quit((secs, ok, vector::to_bytes(&all)));
            Ok(())
        },
    )
    .serial()
    .kind(REDUCER)
}

struct Sender {
    vector: Bytes,
    rounds: usize,
    warmup: usize,
    done: usize,
    started: Instant,
    times: Vec<Value>,
}

impl Sender {
    fn send(&mut self, ctx: &mut Ctx) -> Result<(), SendError> {
        self.started = Instant::now();
        ctx.send_or_wait(1, self.vector.clone())
    }
}

/// Communication test, sending side (serial): sends one vector of `bytes` bytes to
/// the sink and waits for its acknowledgement, `warmup + rounds` times in a row; quits
/// with the `rounds` measured times (seconds, from the send to the acknowledgement).
/// Declared `nonblocking` (it only sends), as is the sink: an acknowledgement from the
/// other process is handled by the thread that read it, with no pool worker woken.
pub fn sender() -> Stage {
    Stage::stateful(
        SEND,
        |a: &Attrs| -> Result<Sender, BoxError> {
            let bytes = usize_attr(a, "bytes")?;
            Ok(Sender {
                vector: Bytes::from(vec![0x5au8; bytes]),
                rounds: usize_attr(a, "rounds")?.max(1),
                warmup: usize_attr(a, "warmup")?,
                done: 0,
                started: Instant::now(),
                times: Vec::new(),
            })
        },
        |st: &mut Sender, ev: Event, ctx: &mut Ctx| {
            if ev.get::<&str>(0)? == "ack" {
                let secs = st.started.elapsed().as_secs_f64();
                let got: u64 = ev.get(1)?;
                if got != st.vector.len() as u64 {
                    return Err(format!("the sink got {got} bytes of {}", st.vector.len()).into());
                }
                st.done += 1;
                if st.done > st.warmup {
                    st.times.push(Value::Float(secs));
                }
                if st.done == st.warmup + st.rounds {
                    ctx.quit(Value::Array(std::mem::take(&mut st.times)));
                    return Ok(());
                }
            }
            st.send(ctx)?;
            Ok(())
        },
    )
    .serial()
    .nonblocking()
    .kind(SEND)
}

/// Communication test, receiving side: acknowledges each vector with its size.
pub fn sink() -> Stage {
    Stage::new(SINK, |ev: Event, ctx: &mut Ctx| {
        let n = ev.arg(0).and_then(Value::as_bytes).map_or(0, <[u8]>::len);
        ctx.send_or_wait(1, ("ack", n as u64))?;
        Ok(())
    })
    .nonblocking()
    .kind(SINK)
}

/// Every kind above, for the daemons.
pub fn registry() -> Registry {
    Registry::new()
        .with(SCATTER, |_| Ok(scatter()))
        .with(SORT, |_| Ok(sorter()))
        .with(REDUCER, |_| Ok(reducer()))
        .with(SEND, |_| Ok(sender()))
        .with(SINK, |_| Ok(sink()))
}

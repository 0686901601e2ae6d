//! `window.merge`: count windows over the event-time merge of several streams, the
//! same windows however the streams' events interleave on arrival.
//!
//! [`Merge`] is the algorithm (no I/O), used by the stage and by programs that must
//! produce the same windows without a graph (the CEP application's sequential
//! baseline).
//!
//! Each source sends its elements in its own order, with an event time. A source's
//! **progress** is the largest time two consecutive elements of it both reached (the
//! largest `min(tᵢ₋₁, tᵢ)`), so that one element with an absurd time — a corrupt log
//! line a year ahead — moves nothing on its own: it takes a second element agreeing
//! with it. An element is **late** when its time is more than `lateness` before its
//! source's progress; late elements leave by the `late` side output (they would have
//! had to go into windows already emitted). The **watermark** is the smallest, over
//! the sources that have not ended, of their progress minus `lateness`: no non-late
//! element to come can be older. Elements older than the watermark are
//! released in `(time, source, order within the source)` order and cut into windows
//! of `size`; when every source has ended, the rest is released and the last partial
//! window emitted. Lateness depends only on a source's own sequence, and the release
//! order only on the elements, so the windows are a function of the sources' contents.
//!
//! Memory: elements wait until every live source has passed their time, so a source
//! far behind the others holds the others' elements meanwhile.

use std::collections::VecDeque;

use leda_core::error::BadEvent;
use leda_core::prelude::*;

use crate::StageError;
use crate::args::{required_positive, to_f64};

/// Why [`Merge::push`] did not take an element.
#[derive(Debug)]
pub enum Refused<T> {
    /// Later than the lateness bound: the element, handed back.
    Late(T),
    /// The source index is not below the number of sources, or the source ended.
    BadSource(T),
}

/// Count windows over the event-time merge of `sources` streams (see the module).
pub struct Merge<T> {
    size: usize,
    lateness: f64,
    /// Per source: its progress (see the module), the time of its last element,
    /// whether it ended.
    latest: Vec<Option<f64>>,
    last: Vec<Option<f64>>,
    ended: Vec<bool>,
    /// Per source: its elements not yet released, in `(time, arrival)` order. A
    /// source's own elements arrive almost in time order (within the lateness), so
    /// an element goes in at or near the back, and the release takes the smallest of
    /// the sources' fronts: no heap over every pending element.
    pending: Vec<VecDeque<(f64, T)>>,
    window: Vec<T>,
    late: u64,
}

impl<T> Merge<T> {
    /// Windows of `size` (≥ 1) over `sources` (≥ 1) streams, `lateness` ≥ 0 in the
    /// elements' time unit.
    pub fn new(size: usize, sources: usize, lateness: f64) -> Merge<T> {
        Merge {
            size: size.max(1),
            lateness: lateness.max(0.0),
            latest: vec![None; sources.max(1)],
            last: vec![None; sources.max(1)],
            ended: vec![false; sources.max(1)],
            pending: (0..sources.max(1)).map(|_| VecDeque::new()).collect(),
            window: Vec::with_capacity(size.clamp(1, super::PREALLOC)),
            late: 0,
        }
    }

    /// Takes `item` of `source` at `time`; completed windows go to `out`.
    pub fn push(
        &mut self,
        time: f64,
        source: usize,
        item: T,
        out: &mut Vec<Vec<T>>,
    ) -> Result<(), Refused<T>> {
        if source >= self.latest.len() || self.ended[source] {
            return Err(Refused::BadSource(item));
        }
        let latest = self.latest[source];
        if latest.is_some_and(|l| time < l - self.lateness) || time.is_nan() {
            self.late += 1;
            return Err(Refused::Late(item));
        }
        if let Some(last) = self.last[source].replace(time) {
            let agreed = last.min(time);
            self.latest[source] = Some(latest.map_or(agreed, |l| l.max(agreed)));
        }
        let q = &mut self.pending[source];
        if q.back().is_none_or(|(t, _)| t.total_cmp(&time).is_le()) {
            q.push_back((time, item));
        } else {
            // After every element of this source not later than it: ties keep arrival order.
            let at = q.partition_point(|(t, _)| t.total_cmp(&time).is_le());
            q.insert(at, (time, item));
        }
        self.release(out);
        Ok(())
    }

    /// `source` has sent everything; completed windows (and, once every source has
    /// ended, the last partial one) go to `out`.
    pub fn end(&mut self, source: usize, out: &mut Vec<Vec<T>>) {
        if let Some(e) = self.ended.get_mut(source) {
            *e = true;
        }
        self.release(out);
    }

    /// Whether every source has ended (and everything was released).
    pub fn finished(&self) -> bool {
        self.ended.iter().all(|&e| e)
    }

    /// Elements refused as late so far.
    pub fn late(&self) -> u64 {
        self.late
    }

    fn watermark(&self) -> f64 {
        self.latest
            .iter()
            .zip(&self.ended)
            .map(|(l, &ended)| match (ended, l) {
                (true, _) => f64::INFINITY,
                (false, Some(l)) => l - self.lateness,
                (false, None) => f64::NEG_INFINITY,
            })
            .fold(f64::INFINITY, f64::min)
    }

    fn release(&mut self, out: &mut Vec<Vec<T>>) {
        let mark = self.watermark();
        loop {
            // The smallest `(time, source)` of the sources' fronts; strictly older than
            // the mark (a non-late element to come may still have the mark's time).
            let mut best: Option<(usize, f64)> = None;
            for (s, q) in self.pending.iter().enumerate() {
                if let Some(&(t, _)) = q.front()
                    && (t < mark || mark == f64::INFINITY)
                    && best.is_none_or(|(_, b)| t.total_cmp(&b).is_lt())
                {
                    best = Some((s, t));
                }
            }
            let Some((s, _)) = best else { break };
            let Some((_, item)) = self.pending[s].pop_front() else {
                break;
            };
            self.window.push(item);
            if self.window.len() == self.size {
                out.push(std::mem::replace(
                    &mut self.window,
                    Vec::with_capacity(self.size.min(super::PREALLOC)),
                ));
            }
        }
        if self.finished() && !self.window.is_empty() {
            out.push(std::mem::take(&mut self.window));
        }
    }
}

/// Most sources a merge takes: each has a queue and a watermark, allocated when the merge
/// starts (`sources = 1e15` aborted the process).
pub const MAX_SOURCES: usize = 1 << 16;

fn sources_attr(stage: &str, attrs: &Attrs) -> Result<usize, StageError> {
    let n = required_positive(stage, attrs, "sources")?;
    if n > MAX_SOURCES {
        return Err(StageError::attr(
            stage,
            "sources",
            format!("must be at most {MAX_SOURCES}, not {n}"),
        ));
    }
    Ok(n)
}

/// `window.merge` (serial): count windows over the event-time merge of several
/// sources, identical however their events interleave (see the module).
///
/// * **Attributes**: `size` (required, ≥ 1), `sources` (required, ≥ 1), `lateness`
///   (≥ 0, default 0, in the elements' time unit).
/// * **Event** `(time, source, element)`: `source` an integer in `0..sources`; or
///   `(source)`: that source has ended.
/// * **Port 1**: `(array)` of `size` elements (the last window of the run: fewer).
/// * **Port `late`** (optional): `("late", time, source, element)` for each element
///   later than the bound. Not connected, a late element fails (to the `error` port, or
///   logged); like every bad event it fails alone: the merge keeps its state.
pub fn merge() -> Stage {
    Stage::stateful(
        "merge",
        |attrs: &Attrs| -> Result<Merge<Value>, BoxError> {
            let size = required_positive("merge", attrs, "size")?;
            let sources = sources_attr("merge", attrs)?;
            let lateness = match attrs.get("lateness") {
                None | Some(Value::Nil) => 0.0,
                Some(v) => to_f64(v).filter(|x| *x >= 0.0 && x.is_finite()).ok_or_else(|| {
                    StageError::attr("merge", "lateness", format!("must be a number ≥ 0, not {v}"))
                })?,
            };
            Ok(Merge::new(size, sources, lateness))
        },
        |m: &mut Merge<Value>, mut ev: Event, ctx: &mut Ctx| {
            // A bad event fails alone (`BadEvent`): the merge keeps what every source sent
            // so far (a plain error destroyed the instance, and with it every element
            // accepted before and each source's progress).
            let bad = |why: String| BadEvent::new(why);
            let mut out = Vec::new();
            match ev.len() {
                1 => {
                    let source: usize = ev.get(0).map_err(|e| bad(e.to_string()))?;
                    m.end(source, &mut out);
                }
                3 => {
                    let stamp = ev.take(0);
                    let time = to_f64(&stamp)
                        .ok_or_else(|| bad("window.merge: the time must be a number".into()))?;
                    let source: usize = ev.get(1).map_err(|e| bad(e.to_string()))?;
                    let item = ev.take(2);
                    match m.push(time, source, item, &mut out) {
                        Ok(()) => {}
                        Err(Refused::Late(item)) if ctx.has_output("late") => {
                            ctx.send_or_wait("late", ("late", stamp, source as u64, item))?;
                        }
                        Err(Refused::Late(_)) => {
                            return Err(bad(format!(
                                "window.merge: an element of source {source} at {time} is \
                                 later than the lateness bound (connect 'late' to keep them)"
                            ))
                            .into());
                        }
                        Err(Refused::BadSource(_)) => {
                            return Err(bad(format!(
                                "window.merge: source {source} is not below 'sources' or has ended"
                            ))
                            .into());
                        }
                    }
                }
                n => {
                    return Err(bad(format!(
                        "window.merge: expected (time, source, element) or (source), got {n} argument(s)"
                    ))
                    .into());
                }
            }
            for w in out {
                ctx.send_or_wait(1, Value::Array(w))?;
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        required_positive(b.name, b.attrs, "size").map_err(|e| e.to_string())?;
        sources_attr(b.name, b.attrs).map_err(|e| e.to_string())?;
        super::port1_bound("merge", b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `streams` (per source, `(time, item)` in source order) in the arrival
    /// order `order` (source indices), then ends every source.
    fn run(streams: &[Vec<(f64, u32)>], order: &[usize], size: usize) -> (Vec<Vec<u32>>, u64) {
        let mut m = Merge::new(size, streams.len(), 3.0);
        let mut next = vec![0; streams.len()];
        let mut out = Vec::new();
        for &s in order {
            if let Some(&(t, x)) = streams[s].get(next[s]) {
                next[s] += 1;
                let _ = m.push(t, s, x, &mut out);
            }
        }
        for s in 0..streams.len() {
            while let Some(&(t, x)) = streams[s].get(next[s]) {
                next[s] += 1;
                let _ = m.push(t, s, x, &mut out);
            }
            m.end(s, &mut out);
        }
        assert!(m.finished());
        (out, m.late())
    }

    #[test]
    fn windows_do_not_depend_on_the_arrival_interleaving() {
        // Three sources, slightly out of order within the lateness (2), one late
        // element in source 1 (time 1 after 9 and 9).
        let streams = vec![
            (0..40).map(|i| (f64::from(i / 2), i)).collect::<Vec<_>>(),
            vec![(3.0, 100), (2.0, 101), (9.0, 102), (9.0, 104), (1.0, 103)],
            (0..25).map(|i| (f64::from(i) * 0.7, 200 + i)).collect(),
        ];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let (first, late) = run(&streams, &[], 7);
        assert_eq!(late, 1, "time 1 after 9 and 9 with lateness 2");
        let all: Vec<u32> = first.iter().flatten().copied().collect();
        assert_eq!(all.len(), 40 + 4 + 25);
        assert!(first[..first.len() - 1].iter().all(|w| w.len() == 7));
        for _ in 0..200 {
            let order: Vec<usize> = (0..70)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 3) as usize
                })
                .collect();
            assert_eq!(run(&streams, &order, 7), (first.clone(), 1), "{order:?}");
        }
    }

    #[test]
    fn release_order_is_time_then_source_then_arrival() {
        // Four sources of 500 elements each, times jittered back by up to the
        // lateness (3) with many ties; fed in a random interleaving. The windows,
        // concatenated, must be every element sorted by (time, source, arrival).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let streams: Vec<Vec<(f64, u32)>> = (0..4u32)
            .map(|s| {
                (0..500u32)
                    .map(|i| {
                        (
                            f64::from(i / 4) - rnd(3) as f64 + 0.5 * (rnd(2) as f64),
                            s * 1000 + i,
                        )
                    })
                    .collect()
            })
            .collect();
        let order: Vec<usize> = (0..2000).map(|_| rnd(4) as usize).collect();
        let (windows, late) = run(&streams, &order, 9);
        assert_eq!(late, 0, "every jitter is within the lateness");
        let mut expected: Vec<(f64, usize, usize, u32)> = streams
            .iter()
            .enumerate()
            .flat_map(|(s, st)| st.iter().enumerate().map(move |(i, &(t, v))| (t, s, i, v)))
            .collect();
        expected.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let got: Vec<u32> = windows.iter().flatten().copied().collect();
        assert_eq!(got, expected.iter().map(|e| e.3).collect::<Vec<_>>());
        assert!(windows[..windows.len() - 1].iter().all(|w| w.len() == 9));
    }

    #[test]
    fn a_source_behind_holds_the_others_until_it_ends() {
        let mut m = Merge::new(2, 2, 0.0);
        let mut out = Vec::new();
        for t in 0..5 {
            m.push(f64::from(t), 0, t, &mut out).unwrap();
        }
        assert!(out.is_empty(), "source 1 has said nothing yet");
        m.push(2.0, 1, 100, &mut out).unwrap();
        assert!(out.is_empty(), "one element of source 1 is no progress yet");
        m.push(3.0, 1, 101, &mut out).unwrap();
        assert_eq!(out, vec![vec![0, 1]], "released below time 2");
        m.end(1, &mut out);
        m.end(0, &mut out);
        assert_eq!(out, vec![vec![0, 1], vec![2, 100], vec![3, 101], vec![4]]);
        assert!(matches!(
            m.push(9.0, 0, 9, &mut out),
            Err(Refused::BadSource(9))
        ));
    }

    #[test]
    fn one_absurd_time_does_not_make_the_rest_of_its_source_late() {
        // Source 0: times 0..20 with one element a year ahead in the middle (a corrupt
        // log line); nothing after it is late, and it is released last, in its place
        // by time. Two such elements in a row are progress: what follows is late.
        let year = 3.15e7;
        let mut times: Vec<f64> = (0..20).map(f64::from).collect();
        times.insert(10, year);
        let other: Vec<(f64, u32)> = (0..20).map(|i| (f64::from(i), 100 + i)).collect();
        let streams = |times: &[f64]| {
            let numbered = times.iter().enumerate().map(|(i, &t)| (t, i as u32));
            vec![numbered.collect(), other.clone()]
        };
        let (windows, late) = run(&streams(&times), &[], 5);
        assert_eq!(late, 0);
        let all: Vec<u32> = windows.iter().flatten().copied().collect();
        assert_eq!(all.len(), 41);
        assert_eq!(all.last(), Some(&10), "the absurd element goes last");
        times.insert(11, year + 1.0);
        assert_eq!(
            run(&streams(&times), &[], 5).1,
            10,
            "confirmed by a second element"
        );
    }
}

//! Hostile `events` frames cost memory in proportion to their size, not to the
//! lengths they declare: a counting allocator measures the peak of each decode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use leda_net::frame::{self, Frame, kind};

/// Counts live bytes and their peak, per thread: a decode runs on its test's thread, and
/// the other tests (the harness runs them on several threads) build their megabyte
/// frames meanwhile, which a process-wide count took for the decode's (CI once saw a
/// bound exceeded by 0.7 MB that way).
struct Counting;

thread_local! {
    // (Constant-initialized and without a destructor: usable from the allocator at any
    // point of a thread's life.)
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    let now = LIVE.get() + by as isize;
    LIVE.set(now);
    if now > PEAK.get() {
        PEAK.set(now);
    }
}

fn shrank(by: usize) {
    LIVE.set(LIVE.get() - by as isize);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        shrank(l.size());
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                grew(new - l.size());
            } else {
                shrank(l.size() - new);
            }
        }
        q
    }
}

/// Runs `f` and says the peak of this thread's allocations during it, beyond what was
/// live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = LIVE.get();
    PEAK.set(before);
    let r = f();
    (usize::try_from(PEAK.get() - before).unwrap_or(0), r)
}

#[global_allocator]
static A: Counting = Counting;

/// Peak bytes allocated while decoding `body` as an `events` frame (beyond what was
/// live before), and whether it decoded.
fn peak_decoding(body: Vec<u8>) -> (usize, bool) {
    let mut raw = vec![kind::EVENTS];
    raw.extend_from_slice(&body);
    let raw = Bytes::from(raw);
    peak_of(|| matches!(frame::decode_shared(raw.clone()), Ok(Frame::Events(_))))
}

/// The memory a decode may take: each byte of the frame may become at most one
/// value (a one-byte integer becomes a whole `Value`), held in vectors that grow by
/// doubling (two values' room per byte), plus a little; events are capped in number
/// (an empty event is one byte on the wire), and the same doubling applies to them.
fn bound(size: usize) -> usize {
    let per_value = 2 * std::mem::size_of::<leda_core::value::Value>();
    let events =
        2 * leda_net::wire::MAX_FRAME_EVENTS * std::mem::size_of::<leda_core::event::Event>();
    per_value * size + events + (256 << 10)
}

const SIZE: usize = 1 << 20;

fn check(name: &str, body: Vec<u8>) -> bool {
    let size = body.len();
    let (peak, ok) = peak_decoding(body);
    assert!(
        peak <= bound(size),
        "{name}: {peak} bytes for a {size}-byte frame (bound {})",
        bound(size)
    );
    ok
}

/// `[[0, [ <nested array headers declaring 2^32-1 items each> ]]]`.
#[test]
fn nested_declared_lengths_reserve_little() {
    let mut b = vec![0x91, 0x92, 0x00, 0x91];
    while b.len() + 5 < SIZE {
        b.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    }
    assert!(!check("nested headers", b), "truncated: refused");
}

/// A frame declaring 2^32-1 groups, then 2^32-1 events, and nothing else.
#[test]
fn declared_groups_and_events_reserve_little() {
    let mut b = vec![0xdd, 0xff, 0xff, 0xff, 0xff, 0x92, 0x00];
    b.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    b.resize(SIZE, 0x90);
    assert!(
        !check("declared counts", b),
        "more events than the cap: refused"
    );
}

/// One byte per empty event: refused past the cap, bounded below it.
#[test]
fn empty_events_are_capped() {
    let n = leda_net::wire::MAX_FRAME_EVENTS;
    let mut b = vec![0x91, 0x92, 0x00, 0xdd];
    b.extend_from_slice(&(n as u32).to_be_bytes());
    b.resize(b.len() + n, 0x90);
    assert!(check("empty events at the cap", b), "decodes");
    let mut b = vec![0x91, 0x92, 0x00, 0xdd];
    b.extend_from_slice(&(SIZE as u32).to_be_bytes());
    b.resize(b.len() + SIZE, 0x90);
    assert!(!check("empty events past the cap", b), "refused");
}

/// One event whose argument is an array of a million one-byte integers: legitimate,
/// and its memory follows the values decoded.
#[test]
fn many_small_values_cost_a_multiple_of_the_frame() {
    let n = SIZE - 16;
    let mut b = vec![0x91, 0x92, 0x00, 0x91, 0x91, 0xdd];
    b.extend_from_slice(&(n as u32).to_be_bytes());
    b.resize(b.len() + n, 0x01);
    assert!(check("a million small integers", b), "decodes");
}

/// A frame near the 64 MiB limit made of nils (one byte on the wire, a whole `Value`
/// decoded): its memory is bounded by the frame's value cap, not by its size. Before
/// the cap, a 16 MiB frame of nils raised a process's peak by some 640 MiB (a review's
/// measurement), and this one decoded whole (the test fails there: "refused").
#[test]
fn a_frame_of_nils_costs_at_most_the_value_cap() {
    let cap = leda_net::wire::MAX_FRAME_VALUES;
    let bound = 2 * cap * std::mem::size_of::<leda_core::value::Value>()
        + 2 * leda_net::wire::MAX_FRAME_EVENTS * std::mem::size_of::<leda_core::event::Event>()
        + (1 << 20);
    // Events of 1,000 nil arguments each, 60 MiB in all.
    let n = 60 * (1 << 20) / 1003;
    let mut b = vec![0x91, 0x92, 0x00, 0xdd];
    b.extend_from_slice(&(n as u32).to_be_bytes());
    for _ in 0..n {
        b.extend_from_slice(&[0xdc, 0x03, 0xe8]);
        b.extend(std::iter::repeat_n(0xc0, 1000));
    }
    let (peak, ok) = peak_decoding(b);
    assert!(!ok, "past the value cap: refused");
    assert!(peak <= bound, "{peak} bytes (bound {bound})");
    // A quit frame of 60 MiB of nils (decoded through rmp-serde): refused before it is
    // decoded at all.
    let n = 60 << 20;
    let mut b = vec![kind::QUIT, 0xdd];
    b.extend_from_slice(&(n as u32).to_be_bytes());
    b.resize(b.len() + n, 0xc0);
    let (peak, r) = peak_of(|| frame::decode(&b).is_err());
    assert!(r, "past the value cap: refused");
    assert!(peak < 1 << 20, "{peak} bytes to refuse it");
}

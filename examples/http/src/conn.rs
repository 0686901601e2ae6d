//! The client connection: the local attachment that travels between stages (socket,
//! bytes read ahead, a slot under the connection limit), and its I/O with timeouts.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::Config;
use crate::error::HttpError;
use crate::request::{self, Parsed, Request};
use crate::sys;

/// The most body bytes one connection writes before other connections get a turn
/// ([`Conn::write_all_fair`]).
pub const FAIR_CHUNK: usize = 512 * 1024;

/// How long a draining server still waits for a request head that had begun to arrive
/// (then `408`), instead of the rest of the header timeout.
const DRAIN_HEAD_GRACE: Duration = Duration::from_secs(1);

/// A server's graceful stop: once [`Drain::begin`] is called it accepts no more
/// connections, closes each open one after the response under way (at once if it is
/// waiting for a request), and [`Drain::open`] says how many are left.
#[derive(Debug, Default)]
pub struct Drain {
    begun: AtomicBool,
    wake: tokio::sync::Notify,
    /// Connections open now (the counter of the accept stage's [`Gate`]).
    open: Arc<AtomicUsize>,
}

impl Drain {
    /// Starts draining.
    pub fn begin(&self) {
        self.begun.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// `true` once [`Drain::begin`] was called.
    pub fn begun(&self) -> bool {
        self.begun.load(Ordering::SeqCst)
    }

    /// Connections still open.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Begins draining and waits up to `grace` for the open connections to end,
    /// calling `pause(d)` between two looks (it waits up to `d`; `true` gives up at
    /// once); the connections still open then (0: all ended). The run goes on: end it
    /// with its handle's `quit`.
    pub fn stop(&self, grace: Duration, mut pause: impl FnMut(Duration) -> bool) -> usize {
        self.begin();
        // (No deadline past what an `Instant` can hold.)
        let until = std::time::Instant::now().checked_add(grace);
        while self.open() > 0 {
            let left = until.map_or(Duration::MAX, |u| {
                u.saturating_duration_since(std::time::Instant::now())
            });
            if left.is_zero() || pause(left.min(Duration::from_millis(20))) {
                break;
            }
        }
        self.open()
    }

    /// Returns once draining has begun.
    pub(crate) async fn wait(&self) {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.begun() {
                return;
            }
            woken.await;
        }
    }

    /// Registers `drain` under a number the graph's stages find it by (their
    /// attributes carry only values).
    pub(crate) fn register(drain: &Arc<Drain>) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut all = drains().lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, d| d.strong_count() > 0);
        all.insert(id, Arc::downgrade(drain));
        id
    }

    /// The drain registered under `id`, while its server lives.
    pub(crate) fn find(id: u64) -> Option<Arc<Drain>> {
        let all = drains().lock().unwrap_or_else(|e| e.into_inner());
        all.get(&id).and_then(Weak::upgrade)
    }
}

fn drains() -> &'static Mutex<HashMap<u64, Weak<Drain>>> {
    static ALL: OnceLock<Mutex<HashMap<u64, Weak<Drain>>>> = OnceLock::new();
    ALL.get_or_init(Mutex::default)
}

/// Returns once `drain` has begun; never without one.
pub(crate) async fn drained(drain: Option<&Drain>) {
    match drain {
        Some(d) => d.wait().await,
        None => std::future::pending().await,
    }
}

/// Counts open connections against a limit.
#[derive(Clone, Debug)]
pub struct Gate {
    open: Arc<AtomicUsize>,
    max: usize,
}

impl Gate {
    /// A gate admitting at most `max` connections at once.
    pub fn new(max: usize) -> Gate {
        Gate {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A gate whose count `drain` reports.
    pub fn counted_by(max: usize, drain: &Drain) -> Gate {
        Gate {
            open: drain.open.clone(),
            max,
        }
    }

    /// A slot if one is free; it is given back when dropped.
    pub fn admit(&self) -> Option<Slot> {
        let mut n = self.open.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Slot(self.open.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// One admitted connection's place under the limit.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What reading the next request gave.
#[derive(Debug)]
pub enum Next {
    /// A request head (its body, if any, already read and discarded).
    Request(Request),
    /// A request to refuse with this error (then close).
    Refuse(HttpError),
    /// The client closed, went idle too long, or the socket failed: close silently.
    Gone,
}

/// A client connection.
#[derive(Debug)]
pub struct Conn {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes received and not yet consumed (pipelined requests).
    pub buf: BytesMut,
    /// Requests served on this connection so far.
    pub served: u64,
    /// Where the head being received ends, searched as bytes arrive.
    scan: request::HeadScan,
    _slot: Option<Slot>,
    /// The server's graceful stop, if it has one.
    drain: Option<Arc<Drain>>,
}

impl Conn {
    /// Wraps an accepted socket; `slot` is `None` for connections refused at the limit.
    pub fn new(stream: TcpStream, slot: Option<Slot>) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            buf: BytesMut::with_capacity(4096),
            served: 0,
            scan: request::HeadScan::default(),
            _slot: slot,
            drain: None,
        }
    }

    /// This connection ends when `drain` begins, after the response under way.
    pub fn drained_by(mut self, drain: Option<Arc<Drain>>) -> Conn {
        self.drain = drain;
        self
    }

    /// `true` once the server is draining: the response under way is the last one,
    /// unless the client has already sent more ([`Conn::more_sent`]).
    pub fn draining(&self) -> bool {
        self.drain.as_ref().is_some_and(|d| d.begun())
    }

    /// `true` if bytes of a further request were received (read ahead, or waiting in
    /// the socket).
    pub fn more_sent(&self) -> bool {
        !self.buf.is_empty() || sys::bytes_waiting(self.stream.as_fd())
    }

    /// Reads the next request head: waits up to the idle timeout for its first byte,
    /// then up to the header timeout for the rest (slow clients get `408`).
    pub async fn next_request(&mut self, cfg: &Config) -> Next {
        let mut deadline: Option<Instant> = None;
        // The drain began while a head was arriving: its deadline, cut short.
        let mut cut: Option<Instant> = None;
        loop {
            if !self.buf.is_empty() {
                deadline.get_or_insert_with(|| Instant::now() + cfg.header_timeout);
                // The head is parsed once it is whole (linear in the bytes received,
                // however they drip in).
                let whole = match self.scan.complete(&self.buf, cfg) {
                    Ok(w) => w,
                    Err(e) => return Next::Refuse(e),
                };
                match if whole {
                    request::parse(&self.buf, cfg)
                } else {
                    Ok(Parsed::Partial)
                } {
                    Ok(Parsed::Complete(mut req)) => {
                        self.scan.reset();
                        req.raw = self.buf.split_to(req.head_len).freeze();
                        return match self.discard_body(req.content_length, deadline).await {
                            Ok(()) => Next::Request(req),
                            Err(e) => e,
                        };
                    }
                    // (A whole head that does not parse whole is malformed.)
                    Ok(Parsed::Partial) if whole => {
                        return Next::Refuse(HttpError::BadRequest("malformed request"));
                    }
                    Ok(Parsed::Partial) => {}
                    Err(e) => return Next::Refuse(e),
                }
            }
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(4096);
            }
            let read = self.stream.read_buf(&mut self.buf);
            // Biased, the read first: a request already in the socket is read, not
            // dropped for the drain (review finding: half of such requests were).
            let r = match deadline {
                // Waiting for a request: a draining server closes the connection.
                None => tokio::select! {
                    biased;
                    r = timeout(cfg.idle_timeout, read) => r,
                    () = drained(self.drain.as_deref()) => {
                        // Bytes that came while the connection was elsewhere may not
                        // be reported by the reactor yet (a busy worker polls it every
                        // few tasks): the socket itself says (seen under load).
                        if !sys::bytes_waiting(self.stream.as_fd()) {
                            return Next::Gone;
                        }
                        deadline = Some(Instant::now() + cfg.header_timeout);
                        continue;
                    }
                },
                // A head arriving when the drain begins gets `DRAIN_HEAD_GRACE` more
                // (review finding: one half-sent head held every drain for its whole
                // timeout).
                Some(d) => {
                    let d = cut.map_or(d, |c| d.min(c));
                    tokio::select! {
                        biased;
                        r = timeout_at(d, read) => r,
                        () = drained(self.drain.as_deref()), if cut.is_none() => {
                            cut = Some(Instant::now() + DRAIN_HEAD_GRACE);
                            continue;
                        }
                    }
                }
            };
            match r {
                Ok(Ok(0)) | Ok(Err(_)) => return Next::Gone,
                Ok(Ok(_)) => {}
                Err(_) if deadline.is_some() => return Next::Refuse(HttpError::Timeout),
                Err(_) => return Next::Gone,
            }
        }
    }

    async fn discard_body(&mut self, mut n: usize, deadline: Option<Instant>) -> Result<(), Next> {
        let deadline = deadline.unwrap_or_else(Instant::now);
        loop {
            let have = n.min(self.buf.len());
            let _ = self.buf.split_to(have);
            n -= have;
            if n == 0 {
                return Ok(());
            }
            match timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Err(Next::Gone),
                Ok(Ok(_)) => {}
                Err(_) => return Err(Next::Refuse(HttpError::Timeout)),
            }
        }
    }

    /// [`Conn::write_all`] in turns of at most [`FAIR_CHUNK`] body bytes, letting other
    /// connections' writes run between two turns (`ctx.nice()`): a large response no
    /// longer goes out in one stretch while the other connections wait, which made the
    /// slowest 1 % of 5 MB responses at 200 connections take 3× nginx's. A body of more
    /// than one turn is written with the socket's unsent bytes bounded by `lowat`
    /// (`TCP_NOTSENT_LOWAT`, 0: not bounded; see `Config::notsent_lowat`).
    pub async fn write_all_fair(
        &mut self,
        head: &[u8],
        body: &[u8],
        limit: Duration,
        lowat: usize,
        ctx: &mut leda_core::prelude::Ctx,
    ) -> io::Result<()> {
        // (A failure to set it only leaves the kernel's default.)
        let lowat = lowat > 0
            && body.len() > FAIR_CHUNK
            && sys::set_notsent_lowat(self.stream.as_fd(), lowat).is_ok();
        let written = self.write_turns(head, body, limit, ctx).await;
        if lowat {
            // 0: the kernel's default again, for the connection's next responses.
            let _ = sys::set_notsent_lowat(self.stream.as_fd(), 0);
        }
        written
    }

    async fn write_turns(
        &mut self,
        head: &[u8],
        body: &[u8],
        limit: Duration,
        ctx: &mut leda_core::prelude::Ctx,
    ) -> io::Result<()> {
        let mut chunks = body.chunks(FAIR_CHUNK);
        self.write_all(head, chunks.next().unwrap_or_default(), limit)
            .await?;
        for chunk in chunks {
            ctx.nice().await;
            self.write_all(&[], chunk, limit).await?;
        }
        Ok(())
    }

    /// Writes `head` then `body` (gathered), each write bounded by `limit` without
    /// progress.
    pub async fn write_all(&mut self, head: &[u8], body: &[u8], limit: Duration) -> io::Result<()> {
        let (mut h, mut b) = (head, body);
        while !h.is_empty() || !b.is_empty() {
            let bufs = [IoSlice::new(h), IoSlice::new(b)];
            let sock = self.stream.as_fd();
            let n = self
                .write_ready(limit, h.len() + b.len(), true, || {
                    sys::send_vectored(sock, &bufs)
                })
                .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_h = n.min(h.len());
            h = &h[from_h..];
            b = &b[n - from_h..];
        }
        Ok(())
    }

    /// One write, `op`, of at most `asked` bytes once the socket is writable (the wait
    /// bounded by `limit`); returns what `op` wrote. With `short_is_full`, a short
    /// write is taken for a full socket buffer and clears the socket's readiness: the
    /// next write waits for the kernel's next "writable" instead of first failing with
    /// `EAGAIN`. (Tokio's `write_vectored` keeps the readiness after a short write; on
    /// a 5 MB response over a rate-limited link, half of its `writev`s failed that
    /// way.) Only for an `op` that stops short for no other reason — a `send` on TCP of
    /// less than the kernel's per-call cap — or no "writable" would ever follow.
    async fn write_ready(
        &self,
        limit: Duration,
        asked: usize,
        short_is_full: bool,
        mut op: impl FnMut() -> io::Result<usize>,
    ) -> io::Result<usize> {
        loop {
            timeout(limit, self.stream.writable())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "send timeout"))??;
            let mut wrote = 0;
            let attempt = self.stream.try_io(Interest::WRITABLE, || {
                wrote = op()?;
                if short_is_full && 0 < wrote && wrote < asked {
                    // Full: `WouldBlock` is what makes `try_io` clear the readiness.
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(wrote)
            });
            match attempt {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && wrote > 0 => return Ok(wrote),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes a response head that a file body follows at once: `MSG_MORE` lets the
    /// kernel put the head and the first file bytes in the same segment.
    pub async fn write_head_more(&mut self, head: &[u8], limit: Duration) -> io::Result<()> {
        let mut rest = head;
        while !rest.is_empty() {
            let sock = self.stream.as_fd();
            let n = self
                .write_ready(limit, rest.len(), true, || sys::send_more(sock, rest))
                .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Sends bytes `0..len` of `file` with `sendfile(2)`: the kernel copies from the
    /// page cache to the socket, no user-space buffer. The offset is explicit, so
    /// `file` may be a descriptor shared with other connections sending at once. Each
    /// wait for the socket to drain is bounded by `limit`; no thread is held meanwhile.
    pub async fn send_file(&mut self, file: &File, len: u64, limit: Duration) -> io::Result<()> {
        let mut offset = 0u64;
        while offset < len {
            let (sock, fd) = (self.stream.as_fd(), file.as_fd());
            let chunk = usize::try_from(len - offset).unwrap_or(usize::MAX);
            // A short `sendfile` may be the file's end (it shrank), not a full socket,
            // and then no "writable" would follow: the readiness is kept, and the next
            // call tells which (`EAGAIN` clears it, 0 ends the response; review rv40).
            let n = self
                .write_ready(limit, chunk, false, || {
                    sys::sendfile(sock, fd, &mut offset, chunk)
                })
                .await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while sending",
                ));
            }
        }
        Ok(())
    }

    /// Closes gracefully: shuts the write side, then drains what the client still sends
    /// (briefly), so that a reset does not destroy the response in flight. Up to 2 s for
    /// an admitted connection; 200 ms for one refused at the limit, whose descriptor
    /// no slot counts (a flood of refused connections that never closed lingered 2 s
    /// each, and drained at `maxpar` per 2 s: review finding, 2026-11-27).
    pub async fn linger_close(mut self) {
        let _ = self.stream.shutdown().await;
        let mut scratch = [0u8; 4096];
        let patience = if self._slot.is_some() {
            Duration::from_secs(2)
        } else {
            Duration::from_millis(200)
        };
        let deadline = Instant::now() + patience;
        let mut drained = 0usize;
        while drained < 1 << 20 {
            match timeout_at(deadline, self.stream.read(&mut scratch)).await {
                Ok(Ok(n)) if n > 0 => drained += n,
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A server connection and its client, with small fixed socket buffers (so that a
    /// write of a few MiB stops short whatever the host's TCP memory settings).
    async fn pair() -> (Conn, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        for (sock, opt) in [
            (server.as_fd(), libc::SO_SNDBUF),
            (client.as_fd(), libc::SO_RCVBUF),
        ] {
            sys::set_int_option(sock, libc::SOL_SOCKET, opt, 64 * 1024).expect("setsockopt");
        }
        (Conn::new(server, None), client)
    }

    /// A client that does not read: the server's writes fill its socket and stop
    /// short. After a short write the socket is not ready, so no write fails with
    /// `EAGAIN` (tokio's `write_vectored` makes one after each short write); once the
    /// client reads, there is room again.
    #[tokio::test]
    async fn a_short_write_waits_for_room_and_gets_it() {
        let (conn, mut client) = pair().await;
        let body = vec![7u8; 1 << 20];
        let (sock, bufs) = (conn.stream.as_fd(), [IoSlice::new(&body)]);
        let (mut sent, mut eagain) = (0, 0);
        // Until the socket stays full for 200 ms.
        let stuck = loop {
            let wrote = conn
                .write_ready(Duration::from_millis(200), body.len(), true, || {
                    let r = sys::send_vectored(sock, &bufs);
                    eagain +=
                        usize::from(matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock));
                    r
                })
                .await;
            match wrote {
                Ok(n) => sent += n,
                Err(e) => break e,
            }
        };
        assert_eq!(stuck.kind(), io::ErrorKind::TimedOut, "{stuck}");
        assert!(sent > 0);
        assert_eq!(eagain, 0, "a write failed with EAGAIN after a short one");
        let mut got = vec![0u8; sent];
        client.read_exact(&mut got).await.unwrap();
        let n = conn
            .write_ready(Duration::from_secs(2), body.len(), true, || {
                sys::send_vectored(sock, &bufs)
            })
            .await
            .expect("room once the client read");
        assert!(n > 0);
    }

    /// A file that ends before the length being sent (it shrank after its size was
    /// read), to a client that reads everything: the response ends at once with
    /// `UnexpectedEof`, not after `limit` with `TimedOut` (review rv40: the short
    /// `sendfile` at the file's end was taken for a full socket, and no "writable"
    /// followed).
    #[tokio::test]
    async fn a_file_shorter_than_its_length_ends_at_once() {
        let (mut conn, mut client) = pair().await;
        let reader = tokio::spawn(async move {
            let (mut buf, mut got) = (vec![0u8; 1 << 16], 0usize);
            loop {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got += n,
                }
            }
        });
        let have = 8usize << 20;
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &vec![1u8; have]).unwrap();
        let start = std::time::Instant::now();
        let e = conn
            .send_file(&file, have as u64 + 1000, Duration::from_secs(3))
            .await
            .expect_err("the file is shorter than its length");
        let took = start.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e} after {took:?}");
        assert!(took < Duration::from_secs(1), "took {took:?}");
        drop(conn);
        assert_eq!(reader.await.unwrap(), have);
    }
}

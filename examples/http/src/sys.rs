//! The system calls the server makes itself, safely wrapped: the only `unsafe` of the
//! static-file path lives here.
//!
//! * [`send_more`], [`send_vectored`] and [`sendfile`]: non-blocking on a non-blocking
//!   socket, they return [`io::ErrorKind::WouldBlock`] when the socket buffer is full,
//!   and the caller waits for writability (see [`crate::conn::Conn::send_file`]);
//! * [`open_beneath`]: `openat2(2)` confined to a directory, with no symlink followed;
//! * [`peer_gone`] and [`bytes_waiting`]: whether the client closed its connection, or
//!   sent bytes not read yet, without reading from it;
//! * [`thread_cpu_time`]: the CPU time of the calling thread (a page's slices);
//! * [`set_notsent_lowat`]: how much a socket holds unsent before it is writable
//!   ([`set_int_option`]: any `int` socket option).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Sends `buf` on `sock` with `MSG_MORE` (more data follows at once, so the kernel may
/// hold a partial segment back: the head of a response and the first bytes of its
/// file body share a packet) and `MSG_NOSIGNAL`. Returns the bytes queued.
pub fn send_more(sock: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid readable buffer of `buf.len()` bytes, and `sock` is a
    // descriptor kept open by the borrow for the whole call.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_MORE | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sends `bufs` on `sock` in order, as one `sendmsg(2)` (gathered, `MSG_NOSIGNAL`: a
/// client gone is an error, not a `SIGPIPE`). Returns the bytes queued.
pub fn send_vectored(sock: BorrowedFd<'_>, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` on Unix (std's documented guarantee);
    // the kernel only reads through the pointer.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    msg.msg_iovlen = bufs.len().min(libc::c_int::MAX as usize) as _;
    // SAFETY: `msg` points at `bufs`, valid readable buffers for the whole call, and
    // `sock` is a descriptor kept open by the borrow.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `true` when the client has closed its side of `sock` (end of stream) or the
/// connection failed, seen without taking anything from it (`MSG_PEEK`, non-blocking):
/// bytes it sent and nobody read yet (a pipelined request) say it is still there. As
/// nginx takes an early end of stream for a client that gave up.
pub fn peer_gone(sock: BorrowedFd<'_>) -> bool {
    peek(sock) == Peek::Gone
}

/// `true` when bytes the client sent wait in `sock` (seen with a non-blocking
/// `MSG_PEEK`, whether or not the reactor has reported them yet).
pub fn bytes_waiting(sock: BorrowedFd<'_>) -> bool {
    peek(sock) == Peek::Bytes
}

#[derive(PartialEq)]
enum Peek {
    Bytes,
    Nothing,
    Gone,
}

/// What a non-blocking `MSG_PEEK` of one byte sees in `sock`.
fn peek(sock: BorrowedFd<'_>) -> Peek {
    let mut byte = 0u8;
    // SAFETY: `byte` is a valid writable byte, and `sock` is a descriptor kept open by
    // the borrow for the whole call.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => Peek::Gone,
        n if n > 0 => Peek::Bytes,
        _ if matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ) =>
        {
            Peek::Nothing
        }
        _ => Peek::Gone,
    }
}

/// Sends up to `count` bytes of `file` from `*offset` to `sock` with `sendfile(2)`, from
/// the page cache, without a user-space copy; advances `*offset` by what was sent.
///
/// The offset is explicit (like `pread`): the file's own position is neither used nor
/// moved, so any number of connections may send from one shared descriptor at once.
/// `Ok(0)` means the file ended before `offset + count` (it shrank).
pub fn sendfile(
    sock: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: &mut u64,
    count: usize,
) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(*offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    // Linux sends at most 0x7ffff000 bytes per call anyway.
    let count = count.min(0x7fff_f000);
    // SAFETY: both descriptors are kept open by their borrows for the whole call, and
    // `off` is a valid, exclusively borrowed off_t that the kernel reads and updates.
    let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut off, count) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    *offset = u64::try_from(off).unwrap_or(*offset);
    Ok(n as usize)
}

/// Opens `path` (relative) under the directory `dir` with `flags` (`O_PATH`: enough to
/// `fstat` it; `O_RDONLY`: to read it), in one `openat2(2)` walk that the kernel keeps
/// beneath `dir` (`RESOLVE_BENEATH`: no `..` above it, no absolute path) and that fails
/// on any symlink on the way (`RESOLVE_NO_SYMLINKS`, `ELOOP`). Kernels without
/// `openat2` (before 5.6) answer `ENOSYS`.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: open_how is plain old data (three integers); all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `dir` is kept open by its borrow, `path` is a NUL-terminated string and
    // `how` a valid open_how of the size passed; the kernel only reads them.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: the kernel just returned this new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The CPU time the calling thread has used (zero if the clock cannot be read).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Sets `TCP_NOTSENT_LOWAT` on `sock`: it is reported writable only while it holds
/// fewer than `bytes` not yet sent (bytes sent and not yet acknowledged do not count);
/// 0 gives it the system's default back (`net.ipv4.tcp_notsent_lowat`, no bound unless
/// set).
pub fn set_notsent_lowat(sock: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int_option(sock, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, v)
}

/// Sets the `int`-valued socket option `name` at `level` of `sock` to `value`
/// (`setsockopt(2)`).
pub fn set_int_option(
    sock: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a valid `c_int` for the whole call, its size is passed, and
    // `sock` is a descriptor kept open by the borrow.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsFd;

    use super::*;

    /// The option is set on the socket, as the kernel reads it back.
    #[test]
    fn notsent_lowat_is_set() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        set_notsent_lowat(s.as_fd(), 128 * 1024).unwrap();
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid out-pointers of the sizes given; `s` is open.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!((r, v), (0, 128 * 1024));
    }

    /// Two interleaved senders from one descriptor: the explicit offsets keep them
    /// apart (the shared file position is never used).
    #[test]
    fn sendfile_with_explicit_offsets_shares_one_descriptor() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        f.write_all(&data).unwrap();
        f.seek(SeekFrom::Start(7)).unwrap();
        let (mut a_tx, mut a_rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let (b_tx, mut b_rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut oa, mut ob) = (0u64, 50_000u64);
        let reader = std::thread::spawn(move || {
            let (mut ra, mut rb) = (Vec::new(), Vec::new());
            a_rx.read_to_end(&mut ra).unwrap();
            b_rx.read_to_end(&mut rb).unwrap();
            (ra, rb)
        });
        // Alternating chunks of 7,000 bytes from the same descriptor.
        while oa < 50_000 || ob < 100_000 {
            if oa < 50_000 {
                let count = (50_000 - oa).min(7_000) as usize;
                assert!(sendfile(a_tx.as_fd(), f.as_fd(), &mut oa, count).unwrap() > 0);
            }
            if ob < 100_000 {
                let count = (100_000 - ob).min(7_000) as usize;
                assert!(sendfile(b_tx.as_fd(), f.as_fd(), &mut ob, count).unwrap() > 0);
            }
        }
        assert_eq!((oa, ob), (50_000, 100_000));
        // Past the end: nothing more to send.
        let mut past = 100_000u64;
        assert_eq!(sendfile(a_tx.as_fd(), f.as_fd(), &mut past, 10).unwrap(), 0);
        a_tx.flush().unwrap();
        drop((a_tx, b_tx));
        let (ra, rb) = reader.join().unwrap();
        assert_eq!(ra, data[..50_000]);
        assert_eq!(rb, data[50_000..]);
        // The descriptor's own position did not move.
        assert_eq!(f.stream_position().unwrap(), 7);
    }
}

//! A connection between two Leda processes: plain TCP, or TCP under TLS ([`crate::tls`])
//! when the process is configured with certificates, and what the handshake left its two
//! ends with ([`Session`]). The handshake and the links see one type; the link splits it
//! into a read half and a write half.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One connection, plain or under TLS. Under TLS a peer's close without `close_notify`
/// (a process that died) reads as the end of the stream, as over plain TCP.
pub struct Conn {
    stream: Stream,
    session: Option<Session>,
}

/// What the handshake leaves both ends of a connection with: a key only they know
/// (derived from the shared secret and the whole handshake), and which end dialled.
#[derive(Clone, Copy)]
pub struct Session {
    /// The connection's key.
    pub(crate) key: [u8; 32],
    /// This end is the one that connected (the handshake's client).
    pub(crate) client: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session {{ client: {} }}", self.client)
    }
}

enum Stream {
    /// Plain TCP (the shared-secret handshake still authenticates the peer).
    Plain(TcpStream),
    /// TLS, this side the client.
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS, this side the server.
    TlsServer(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.stream {
            Stream::Plain(_) => "Conn::Plain",
            Stream::TlsClient(_) => "Conn::TlsClient",
            Stream::TlsServer(_) => "Conn::TlsServer",
        })
    }
}

/// The read half of a [`Conn`].
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of a [`Conn`].
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// How a connection whose peer should have said nothing stopped being quiet
/// ([`Conn::silence_broken`]).
pub(crate) enum Broken {
    /// The peer closed it.
    Closed,
    /// The peer sent something.
    Spoke,
    /// Reading failed.
    Failed(io::Error),
}

impl Conn {
    /// Completes when a peer that should say nothing for now (a launcher waiting for
    /// `Ready`, a daemon waiting for `Start`) closes the connection, sends something,
    /// or the connection fails: each means the exchange is over. Reads at most one
    /// byte.
    pub(crate) async fn silence_broken(&mut self) -> Broken {
        use tokio::io::AsyncReadExt;
        match self.read(&mut [0u8; 1]).await {
            Ok(0) => Broken::Closed,
            Ok(_) => Broken::Spoke,
            Err(e) => Broken::Failed(e),
        }
    }

    /// A plain TCP connection (before its handshake).
    pub fn plain(s: TcpStream) -> Conn {
        Conn {
            stream: Stream::Plain(s),
            session: None,
        }
    }

    pub(crate) fn tls_client(s: tokio_rustls::client::TlsStream<TcpStream>) -> Conn {
        Conn {
            stream: Stream::TlsClient(Box::new(s)),
            session: None,
        }
    }

    pub(crate) fn tls_server(s: tokio_rustls::server::TlsStream<TcpStream>) -> Conn {
        Conn {
            stream: Stream::TlsServer(Box::new(s)),
            session: None,
        }
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match &self.stream {
            Stream::Plain(s) => s,
            Stream::TlsClient(s) => s.get_ref().0,
            Stream::TlsServer(s) => s.get_ref().0,
        }
    }

    /// `true` under TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self.stream, Stream::Plain(_))
    }

    /// What the handshake left this end with (`None` before it).
    pub fn session(&self) -> Option<Session> {
        self.session
    }

    pub(crate) fn set_session(&mut self, s: Session) {
        self.session = Some(s);
    }

    /// Splits the connection for a reader task and a writer task (plain TCP without a
    /// lock between the halves).
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self.stream {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Stream::TlsClient(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(CloseIsEnd(r)), Box::new(w))
            }
            Stream::TlsServer(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(CloseIsEnd(r)), Box::new(w))
            }
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.get_mut().stream {
            Stream::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::TlsClient($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            Stream::TlsServer($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let tls = !matches!(self.stream, Stream::Plain(_));
        let r = each!(self, s => s.poll_read(cx, buf));
        if tls { close_is_end(r) } else { r }
    }
}

/// Under TLS a peer's close without `close_notify` (what a process that dies, or drops
/// its connection, leaves) fails the read with `UnexpectedEof` where plain TCP reads
/// the end: here it reads as the end too, so that every reader (links, deployment,
/// handshake) tells a peer's close alike on both. Nothing is taken on trust by it: a
/// close forged by a third party, truncating the stream, cuts a frame (an error) or
/// comes between frames, where an end without the peer's `Quit` is a loss.
fn close_is_end(r: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
    match r {
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::debug!(error = %e, "TLS peer closed without close_notify: read as the end");
            Poll::Ready(Ok(()))
        }
        r => r,
    }
}

/// The read half of a TLS connection, its peer's close read as the end ([`close_is_end`]).
struct CloseIsEnd<R>(R);

impl<R: AsyncRead + Unpin> AsyncRead for CloseIsEnd<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        close_is_end(Pin::new(&mut self.0).poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write(cx, b))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::TlsClient(s) => s.is_write_vectored(),
            Stream::TlsServer(s) => s.is_write_vectored(),
        }
    }
}

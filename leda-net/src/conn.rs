//! A connection between two Leda processes: plain TCP, or TCP under TLS ([`crate::tls`])
//! when the process is configured with certificates. The handshake and the links see
//! one type; the link splits it into a read half and a write half.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One connection, plain or under TLS.
pub enum Conn {
    /// Plain TCP (the shared-secret handshake still authenticates the peer).
    Plain(TcpStream),
    /// TLS, this side the client.
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS, this side the server.
    TlsServer(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Plain(_) => "Conn::Plain",
            Conn::TlsClient(_) => "Conn::TlsClient",
            Conn::TlsServer(_) => "Conn::TlsServer",
        })
    }
}

/// The read half of a [`Conn`].
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of a [`Conn`].
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

impl Conn {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::TlsClient(s) => s.get_ref().0,
            Conn::TlsServer(s) => s.get_ref().0,
        }
    }

    /// `true` under TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Conn::Plain(_))
    }

    /// Splits the connection for a reader task and a writer task (plain TCP without a
    /// lock between the halves).
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Conn::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Conn::TlsClient(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
            Conn::TlsServer(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Conn::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Conn::TlsClient($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            Conn::TlsServer($s) => {
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
        each!(self, s => s.poll_read(cx, buf))
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
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::TlsClient(s) => s.is_write_vectored(),
            Conn::TlsServer(s) => s.is_write_vectored(),
        }
    }
}

//! The benchmark's peer: a minimal hand-written tokio TCP + rmp-serde receiver and
//! echo server, with the same framing idea (u32 LE length + msgpack batch).

use leda_core::value::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// Accepts one connection, decodes batches (`[[args...], ...]`) until `count`
/// events arrived, then answers one byte.
pub async fn recv(listener: TcpListener, count: u64) -> std::io::Result<()> {
    let (s, _) = listener.accept().await?;
    s.set_nodelay(true)?;
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let mut got = 0u64;
    let mut buf = Vec::new();
    while got < count {
        let len = rd.read_u32_le().await? as usize;
        buf.resize(len, 0);
        rd.read_exact(&mut buf).await?;
        let batch: Vec<Vec<Value>> = rmp_serde::from_slice(&buf).map_err(std::io::Error::other)?;
        got += batch.len() as u64;
    }
    wr.write_all(&[1]).await?;
    Ok(())
}

/// Accepts one connection and sends every frame back (decoded and re-encoded).
pub async fn echo(listener: TcpListener) -> std::io::Result<()> {
    let (s, _) = listener.accept().await?;
    s.set_nodelay(true)?;
    let (mut rd, mut wr) = s.into_split();
    let mut buf = Vec::new();
    loop {
        let len = match rd.read_u32_le().await {
            Ok(n) => n as usize,
            Err(_) => return Ok(()),
        };
        buf.resize(len, 0);
        rd.read_exact(&mut buf).await?;
        let batch: Vec<Vec<Value>> = rmp_serde::from_slice(&buf).map_err(std::io::Error::other)?;
        let out = rmp_serde::to_vec(&batch).map_err(std::io::Error::other)?;
        let mut frame = (out.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&out);
        wr.write_all(&frame).await?;
    }
}

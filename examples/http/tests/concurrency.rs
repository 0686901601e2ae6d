//! 1,000 concurrent keep-alive connections, all open at once, all served.

mod common;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONNS: usize = 1000;
const REQUESTS: usize = 3;

async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Vec<u8>) {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    buf.drain(..end);
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < len {
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed inside a body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (status, buf.drain(..len).collect())
}

#[test]
fn thousand_concurrent_keep_alive_connections() {
    let s = common::server(|_| {});
    let addr = s.addr;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = rt.block_on(async move {
        // Open every connection first, so that all 1,000 are open together.
        let mut conns = Vec::with_capacity(CONNS);
        for _ in 0..CONNS {
            conns.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CONNS));
        let mut tasks = Vec::with_capacity(CONNS);
        for (i, mut c) in conns.into_iter().enumerate() {
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut buf = Vec::new();
                let mut ok = 0;
                for k in 0..REQUESTS {
                    let path = if (i + k) % 5 == 0 {
                        "/echo.lua"
                    } else {
                        "/index.html"
                    };
                    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
                        .await
                        .expect("write");
                    let (status, body) = read_response(&mut c, &mut buf).await;
                    assert_eq!(status, 200);
                    assert!(!body.is_empty());
                    ok += 1;
                }
                ok
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("served in time")
                .expect("client task");
        }
        total
    });
    assert_eq!(served, CONNS * REQUESTS);
}

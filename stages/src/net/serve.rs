//! `net.http.serve`: a tiny HTTP page server (for local demos and tests).

use leda_core::error::SendError;
use leda_core::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::listen_addr;
use crate::StageError;
use crate::args::{positive_attr, seconds_attr};

fn pages_of(stage: &str, attrs: &Attrs) -> Result<Vec<String>, StageError> {
    match (attrs.get("pages"), attrs.get("body")) {
        (Some(Value::Array(a)), None) if !a.is_empty() => a
            .iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s.clone()),
                other => Err(StageError::attr(
                    stage,
                    "pages",
                    format!("must hold strings, not {other}"),
                )),
            })
            .collect(),
        (None, Some(Value::Str(b))) => Ok(vec![b.clone()]),
        _ => Err(StageError::attr(
            stage,
            "pages",
            "must be a non-empty array of strings (or set 'body', a string), not both",
        )),
    }
}

/// `net.http.serve` (parallel; asynchronous): answers every request with a page.
///
/// * **Event**: `(host, port)`, `("host:port")` or `(port)`; port 0 picks a free one.
/// * **Attribute `pages`**: an array of page bodies, served in turn (request *k*
///   gets page *k* mod n), or **`body`**: one page for every request.
/// * **Attribute `count`** (optional): stop after this many requests.
/// * **Attribute `request_timeout`** (seconds, default 5): how long a client has to
///   send its request head; a client that sends nothing (or too little) in that time
///   is dropped, so it holds the server up at most that long.
/// * **Port `listening`** (optional): `("http://host:port/")` once listening.
/// * **bind**: `pages`/`body`, and `count` and `request_timeout` when set, must be
///   valid.
///
/// Requests are answered one at a time, `200 OK`, `text/html`, then the connection is
/// closed: a demo and test server (the ticker's quote page), not a web server; while
/// one client is being served (or is slow to send its request) the others wait.
pub fn serve() -> Stage {
    crate::args::waiting("serve", |ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let pages = pages_of(&name, ctx.attrs())?;
        let (limit, request_timeout) = serve_attrs(&name, ctx.attrs())?;
        let addr = listen_addr(&ev)
            .ok_or_else(|| StageError::event(&name, "expected (host, port), (\"host:port\") or (port)"))?;
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|e| StageError::io(&name, format!("listen on {addr}"), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| StageError::io(&name, "local address", e))?;
        tracing::info!(stage = %name, %bound, "serving pages");
        if ctx.has_output("listening") {
            match ctx.send_wait("listening", format!("http://{bound}/")).await {
                Ok(()) | Err(SendError::Stopped) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut served = 0usize;
        while limit.is_none_or(|n| served < n) {
            let (mut s, peer) = listener
                .accept()
                .await
                .map_err(|e| StageError::io(&name, "accept", e))?;
            // Read the request head (bounded), then answer.
            let mut head = Vec::new();
            let mut buf = [0u8; 2048];
            let read_head = async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break false,
                        Ok(n) => {
                            head.extend_from_slice(&buf[..n]);
                            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                                break true;
                            }
                            if head.len() > 64 * 1024 {
                                break false;
                            }
                        }
                    }
                }
            };
            let complete = tokio::time::timeout(request_timeout, read_head)
                .await
                .unwrap_or(false);
            if !complete {
                tracing::debug!(stage = %name, %peer, "incomplete request ignored");
                continue;
            }
            let page = &pages[served % pages.len()];
            served += 1;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
            if let Err(e) = s.write_all(answer.as_bytes()).await {
                tracing::debug!(stage = %name, %peer, error = %e, "client went away");
            }
            let _ = s.shutdown().await;
        }
        Ok(())
    })
    .bind(|b| {
        pages_of(b.name, b.attrs).map_err(|e| e.to_string())?;
        serve_attrs(b.name, b.attrs).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// `count` (optional) and `request_timeout` (default 5 s) of `net.http.serve`.
fn serve_attrs(
    stage: &str,
    attrs: &Attrs,
) -> Result<(Option<usize>, std::time::Duration), StageError> {
    let limit = positive_attr(stage, attrs, "count")?;
    let timeout = seconds_attr(stage, attrs, "request_timeout")?.unwrap_or(5.0);
    let timeout = std::time::Duration::try_from_secs_f64(timeout)
        .map_err(|e| StageError::attr(stage, "request_timeout", e.to_string()))?;
    Ok((limit, timeout))
}

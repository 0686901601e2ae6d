//! The fenced register: the resource the locks protect, a process of its own.
//!
//! Line protocol on loopback (a test fixture, not a product): `R LOCK FENCE` → `V N`;
//! `W LOCK CLIENT FENCE VALUE` → `OK` if `FENCE` is at least the largest fence the register
//! has seen for `LOCK`, in a read or an accepted write (the value becomes `VALUE`), else
//! `STALE MAX`; `F` → the register writes a `final` line per lock and answers `DONE`. Each
//! write is appended to the history file in the register's order, as it is decided.
//!
//! Reads count: a holder paused between its read and its write (its lease lost meanwhile)
//! must not have its increment accepted after the next holder read the same value, or one
//! of the two increments is lost although each write's fence was the largest so far.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use leda_lock_service::check::Record;

#[derive(Default)]
struct State {
    /// Per lock: (value, largest fence read or accepted).
    locks: BTreeMap<String, (u64, u64)>,
    out: Option<std::fs::File>,
}

fn emit(out: &mut Option<std::fs::File>, rec: &Record) -> std::io::Result<()> {
    if let Some(f) = out {
        let line = serde_json::to_string(rec).map_err(std::io::Error::other)?;
        writeln!(f, "{line}")?;
        f.flush()?;
    }
    Ok(())
}

fn serve_conn(stream: TcpStream, state: Arc<Mutex<State>>) -> anyhow::Result<bool> {
    let mut w = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let parts: Vec<&str> = line.split_whitespace().collect();
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *st;
        let answer = match parts.as_slice() {
            ["R", lock, fence] => {
                let fence: u64 = fence.parse()?;
                let entry = st.locks.entry((*lock).to_owned()).or_default();
                entry.1 = entry.1.max(fence);
                format!("V {}", entry.0)
            }
            ["W", lock, client, fence, value] => {
                let (fence, value): (u64, u64) = (fence.parse()?, value.parse()?);
                let entry = st.locks.entry((*lock).to_owned()).or_default();
                let accepted = fence >= entry.1;
                if accepted {
                    *entry = (value, fence);
                }
                let max = entry.1;
                emit(
                    &mut st.out,
                    &Record::Write {
                        lock: (*lock).to_owned(),
                        client: (*client).to_owned(),
                        fence,
                        accepted,
                    },
                )?;
                if accepted {
                    "OK".to_owned()
                } else {
                    format!("STALE {max}")
                }
            }
            ["F"] => {
                for (lock, (value, _)) in st.locks.clone() {
                    emit(
                        &mut st.out,
                        &Record::Final {
                            lock,
                            register: value,
                        },
                    )?;
                }
                st.out = None;
                writeln!(w, "DONE")?;
                return Ok(true);
            }
            _ => format!("ERR unknown request {line:?}"),
        };
        writeln!(w, "{answer}")?;
    }
    Ok(false)
}

/// Runs the register on `listen`, writing to `history`, until a client sends `F`.
pub fn run(listen: &str, history: &Path) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    let out = std::fs::File::create(history)
        .with_context(|| format!("creating {}", history.display()))?;
    println!("LISTENING {}", listener.local_addr()?);
    let state = Arc::new(Mutex::new(State {
        locks: BTreeMap::new(),
        out: Some(out),
    }));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (state, done) = (state.clone(), done_tx.clone());
            std::thread::spawn(move || {
                if let Ok(true) = serve_conn(stream, state) {
                    let _ = done.send(());
                }
            });
        }
    });
    let _ = done_rx.recv();
    Ok(())
}

/// A connection to the register.
pub struct Register {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Register {
    /// Connects to the register at `addr`.
    pub fn connect(addr: &str) -> anyhow::Result<Register> {
        let s = TcpStream::connect(addr).with_context(|| format!("register at {addr}"))?;
        let _ = s.set_nodelay(true);
        Ok(Register {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    fn ask(&mut self, line: &str) -> anyhow::Result<String> {
        writeln!(self.w, "{line}")?;
        let mut answer = String::new();
        if self.r.read_line(&mut answer)? == 0 {
            anyhow::bail!("the register closed the connection");
        }
        Ok(answer.trim().to_owned())
    }

    /// The value guarded by `lock`, read by the holder of `fence`.
    pub fn read(&mut self, lock: &str, fence: u64) -> anyhow::Result<u64> {
        let a = self.ask(&format!("R {lock} {fence}"))?;
        a.strip_prefix("V ")
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("register said {a:?}"))
    }

    /// Writes `value` under `lock` with `fence`; `true` if accepted.
    pub fn write(
        &mut self,
        lock: &str,
        client: &str,
        fence: u64,
        value: u64,
    ) -> anyhow::Result<bool> {
        let a = self.ask(&format!("W {lock} {client} {fence} {value}"))?;
        Ok(a == "OK")
    }

    /// Ends the register's history (final values) and stops it.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let a = self.ask("F")?;
        anyhow::ensure!(a == "DONE", "register said {a:?}");
        Ok(())
    }
}

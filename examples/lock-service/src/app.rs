//! The example's application: clients that increment a shared counter file under the lock and
//! check the fencing token, and the stage that collects their results.
//!
//! The counter file holds `count last_fence`. A client holding the lock with fencing token `f`
//! reads it, refuses (and counts a fencing violation) if `f ≤ last_fence`, and writes
//! `count + 1, f`. If mutual exclusion failed, two clients would read the same count and one
//! update would be lost: the final count would fall short of the number of increments.

use std::path::Path;

use leda_core::prelude::*;

/// The registry kind of worker stages.
pub const APP_KIND: &str = "lock.app";

/// Why the counter could not be bumped.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// Reading or writing the file failed.
    #[error("counter file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file does not hold `count fence`.
    #[error("counter file {path}: malformed content {content:?}")]
    Malformed {
        /// The file.
        path: String,
        /// What it holds.
        content: String,
    },
}

/// Reads `count last_fence` (an empty or missing file is `(0, None)`).
pub fn read_counter(path: &Path) -> Result<(u64, Option<u64>), CounterError> {
    let content = match std::fs::read_to_string(path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(CounterError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let mut it = content.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (None, _) => Ok((0, None)),
        (Some(Ok(c)), Some(Ok(f))) => Ok((c, Some(f))),
        _ => Err(CounterError::Malformed {
            path: path.display().to_string(),
            content,
        }),
    }
}

/// One guarded increment with fencing token `fence`: `Ok(true)` if written, `Ok(false)` if
/// refused because `fence` is not newer than the file's last fence.
pub fn bump_counter(path: &Path, fence: u64) -> Result<bool, CounterError> {
    let (count, last) = read_counter(path)?;
    if last.is_some_and(|last| fence <= last) {
        return Ok(false);
    }
    std::fs::write(path, format!("{} {fence}\n", count + 1)).map_err(|source| {
        CounterError::Io {
            path: path.display().to_string(),
            source,
        }
    })?;
    Ok(true)
}

struct Worker {
    node: i64,
    clients: i64,
    iters: i64,
    resource: String,
    counter: String,
    done: Vec<i64>,
    written: i64,
    refused: i64,
}

/// A worker stage `app<node>` with `clients` concurrent clients, each doing `iters` guarded
/// increments of `counter` under lock `resource` (port `front`); when all are done it reports
/// `("done", node, written, refused)` on port `done`.
pub fn app_stage(
    node: usize,
    clients: usize,
    iters: usize,
    resource: &str,
    counter: &str,
) -> Stage {
    Stage::stateful(
        format!("app{node}"),
        |a: &Attrs| -> Result<Worker, BoxError> {
            let clients: i64 = a.get_as("clients")?;
            Ok(Worker {
                node: a.get_as("node")?,
                clients,
                iters: a.get_as("iters")?,
                resource: a.get_as("resource")?,
                counter: a.get_as("counter")?,
                done: vec![0; clients.max(0) as usize],
                written: 0,
                refused: 0,
            })
        },
        |w: &mut Worker, ev: Event, ctx: &mut Ctx| {
            let tag: String = ev.get(0)?;
            let id_of = |client: i64| w.node * 1_000_000 + client;
            match tag.as_str() {
                "start" => {
                    if w.iters == 0 {
                        ctx.send("done", ("done", w.node, 0i64, 0i64))?;
                    }
                    for c in 0..w.clients {
                        if w.iters > 0 {
                            ctx.send("front", ("acquire", id_of(c), w.resource.as_str(), false))?;
                        }
                    }
                }
                "granted" => {
                    let id: i64 = ev.get(1)?;
                    let fence: i64 = ev.get(3)?;
                    if bump_counter(Path::new(&w.counter), fence as u64)? {
                        w.written += 1;
                    } else {
                        tracing::error!(node = w.node, fence, "stale fencing token refused");
                        w.refused += 1;
                    }
                    ctx.send("front", ("release", id, w.resource.as_str()))?;
                }
                "released" => {
                    let id: i64 = ev.get(1)?;
                    let c = id - w.node * 1_000_000;
                    let slot = w
                        .done
                        .get_mut(c as usize)
                        .ok_or_else(|| format!("app: reply for unknown client {id}"))?;
                    *slot += 1;
                    if *slot < w.iters {
                        ctx.send("front", ("acquire", id, w.resource.as_str(), false))?;
                    } else if w.done.iter().all(|&d| d >= w.iters) {
                        ctx.send("done", ("done", w.node, w.written, w.refused))?;
                    }
                }
                other => return Err(format!("app: unexpected reply {other:?}").into()),
            }
            Ok(())
        },
    )
    .serial()
    .autostart("start")
    .kind(APP_KIND)
    .attr("node", node as i64)
    .attr("clients", clients as i64)
    .attr("iters", iters as i64)
    .attr("resource", resource)
    .attr("counter", counter)
}

/// Rebuilds a worker stage from its attributes (for a daemon's registry), without its
/// autostart event (the deployment ships the initial events).
pub fn app_stage_from_attrs(a: &Attrs) -> Result<Stage, BoxError> {
    let node: usize = a.get_as("node")?;
    let clients: usize = a.get_as("clients")?;
    let iters: usize = a.get_as("iters")?;
    let resource: String = a.get_as("resource")?;
    let counter: String = a.get_as("counter")?;
    let stage = app_stage(node, clients, iters, &resource, &counter);
    stage.take_pushed();
    Ok(stage)
}

/// The results collector (`done`, serial): after `expected` `("done", node, written,
/// refused)` reports it quits the run with `("done", written, refused)`.
pub fn done_stage(expected: usize) -> Stage {
    Stage::stateful(
        "done",
        move |_: &Attrs| -> Result<(usize, i64, i64), BoxError> { Ok((0, 0, 0)) },
        move |s: &mut (usize, i64, i64), ev: Event, ctx: &mut Ctx| {
            s.0 += 1;
            s.1 += ev.get::<i64>(2)?;
            s.2 += ev.get::<i64>(3)?;
            if s.0 == expected {
                ctx.quit(("done", s.1, s.2));
            }
            Ok(())
        },
    )
    .serial()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_increments_and_refuses_stale_fences() {
        let dir = std::env::temp_dir().join(format!("lock-counter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c");
        let _ = std::fs::remove_file(&f);
        assert_eq!(read_counter(&f).unwrap(), (0, None));
        assert!(bump_counter(&f, 3).unwrap());
        assert!(bump_counter(&f, 5).unwrap());
        assert!(!bump_counter(&f, 5).unwrap(), "same fence refused");
        assert!(!bump_counter(&f, 4).unwrap(), "older fence refused");
        assert_eq!(read_counter(&f).unwrap(), (2, Some(5)));
        std::fs::write(&f, "x").unwrap();
        assert!(matches!(
            bump_counter(&f, 9),
            Err(CounterError::Malformed { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

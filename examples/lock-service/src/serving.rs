//! Starting a serving group as processes (`lock-service serve`, one per node), for what
//! drives one from outside: the tests, `lock-service bench`, `lock-check`.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::time::Duration;

use anyhow::{Context, bail};

/// Starts nodes `n - 1` down to 0 with `spawn(i)` (a `serve` command with stdout piped): the
/// others first, since node 0 deploys to them. Reads each node's `CLIENTS ADDR` line, waits
/// up to `within` for node 0's `SERVING`, and keeps draining their stdout. Returns the nodes
/// and their client addresses, by node id; on an error the nodes started are killed.
pub fn start_group(
    n: usize,
    within: Duration,
    mut spawn: impl FnMut(usize) -> std::io::Result<Child>,
) -> anyhow::Result<(Vec<Child>, Vec<String>)> {
    let mut nodes: Vec<Option<Child>> = (0..n).map(|_| None).collect();
    let mut clients = vec![String::new(); n];
    let started = (|| -> anyhow::Result<()> {
        for i in (0..n).rev() {
            let child = nodes[i].insert(spawn(i).with_context(|| format!("starting node {i}"))?);
            let out = child
                .stdout
                .take()
                .context("a node without a piped stdout")?;
            let mut lines = BufReader::new(out).lines();
            let first = lines.next().transpose()?.unwrap_or_default();
            clients[i] = first
                .strip_prefix("CLIENTS ")
                .with_context(|| format!("node {i} said {first:?}"))?
                .trim()
                .to_owned();
            // Keep reading (node 0's SERVING) so that the pipe never fills.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            if i == 0 {
                match rx.recv_timeout(within) {
                    Ok(line) if line.starts_with("SERVING") => {}
                    Ok(line) => bail!("node 0 said {line:?}"),
                    Err(_) => bail!("the group did not start ({} s at most)", within.as_secs()),
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = started {
        for c in nodes.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        return Err(e);
    }
    Ok((nodes.into_iter().flatten().collect(), clients))
}

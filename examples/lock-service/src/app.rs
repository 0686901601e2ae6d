//! The example's application: clients that increment a shared counter file under the lock and
//! check the fencing token, and the stage that collects their results.
//!
//! The counter file holds `count last_fence`. A client holding the lock with fencing token `f`
//! reads it, refuses (and counts a fencing violation) if `f ≤ last_fence`, and writes
//! `count + 1, f`. If mutual exclusion failed, two clients would read the same count and one
//! update would be lost: the final count would fall short of the number of increments.

use std::path::Path;

use leda_core::prelude::*;
use leda_mutex::multi::stage::decode_holds;
use leda_mutex::rng::SplitMix64;

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
    /// Multi-resource locks (`[[name, k], ...]` attribute `multi`), empty for none.
    multi: Vec<(String, u32)>,
    /// `acquire_all` rounds per client after its single-lock increments.
    multi_rounds: i64,
    multi_done: Vec<i64>,
    rng: SplitMix64,
    tally: MultiTally,
    reported: bool,
}

impl Worker {
    fn id_of(&self, client: i64) -> i64 {
        self.node * 1_000_000 + client
    }

    fn client_of(&self, id: i64) -> Result<usize, BoxError> {
        let c = id - self.node * 1_000_000;
        usize::try_from(c)
            .ok()
            .filter(|&c| c < self.done.len())
            .ok_or_else(|| format!("app: reply for unknown client {id}").into())
    }

    /// Client `c` is done with the single lock: its multi rounds, or the end.
    fn next_phase(&mut self, c: usize, ctx: &mut Ctx) -> HandlerResult {
        if !self.multi.is_empty()
            && self
                .multi_done
                .get(c)
                .is_some_and(|&m| m < self.multi_rounds)
        {
            let items = random_request(&self.multi, &mut self.rng)
                .into_iter()
                .map(|(n, k)| Value::Array(vec![Value::Str(n), Value::Int(i64::from(k))]))
                .collect();
            let id = self.id_of(c as i64);
            return Ok(ctx.send(
                "front",
                Event::new()
                    .with("acquire_all")
                    .with(id)
                    .with(Value::Array(items)),
            )?);
        }
        let finished = |(d, m): (&i64, &i64)| {
            *d >= self.iters && (self.multi.is_empty() || *m >= self.multi_rounds)
        };
        if !self.reported && self.done.iter().zip(&self.multi_done).all(finished) {
            self.reported = true;
            let expected: Vec<Value> = self
                .tally
                .expected
                .iter()
                .map(|(n, k)| Value::Array(vec![Value::Str(n.clone()), Value::Int(*k as i64)]))
                .collect();
            ctx.send(
                "done",
                Event::new()
                    .with("done")
                    .with(self.node)
                    .with(self.written)
                    .with(self.refused)
                    .with(self.tally.grants as i64)
                    .with(self.tally.stale as i64)
                    .with(Value::Array(expected)),
            )?;
        }
        Ok(())
    }

    /// Guarded increments of the counter file of every instance held.
    fn multi_granted(&mut self, holds: &Value) -> HandlerResult {
        self.tally.grants += 1;
        for (resource, instance, fence) in decode_holds(holds)? {
            *self.tally.expected.entry(resource.clone()).or_default() += 1;
            let path = multi_counter_path(Path::new(&self.counter), &resource, instance);
            if bump_counter(&path, fence)? {
                *self.tally.written.entry(resource).or_default() += 1;
            } else {
                tracing::error!(node = self.node, %resource, instance, fence, "stale fencing token refused");
                self.tally.stale += 1;
            }
        }
        Ok(())
    }
}

/// A worker stage `app<node>` with `clients` concurrent clients, each doing `iters` guarded
/// increments of `counter` under lock `resource` (port `front`); when all are done it reports
/// `("done", node, written, refused, multi_grants, multi_stale, multi_expected)` on port
/// `done`.
///
/// With [`set_multi_work`] each client then also does `acquire_all` rounds over the group's
/// multi-resource locks (a random subset of at least 2, guarded increments of one counter
/// file per instance held, [`multi_counter_path`] with base `counter`); `multi_expected` is
/// an array of `[lock, instances granted]`.
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
            let node: i64 = a.get_as("node")?;
            let multi: Option<Vec<(String, u32)>> = a.get_as("multi")?;
            let seed: Option<i64> = a.get_as("multi_seed")?;
            Ok(Worker {
                node,
                clients,
                iters: a.get_as("iters")?,
                resource: a.get_as("resource")?,
                counter: a.get_as("counter")?,
                done: vec![0; clients.max(0) as usize],
                written: 0,
                refused: 0,
                multi: multi.unwrap_or_default(),
                multi_rounds: a.get_as::<Option<i64>>("multi_rounds")?.unwrap_or(0),
                multi_done: vec![0; clients.max(0) as usize],
                rng: SplitMix64::new(
                    (seed.unwrap_or(0) as u64) ^ (node as u64).wrapping_mul(0x9E37_79B9),
                ),
                tally: MultiTally::default(),
                reported: false,
            })
        },
        |w: &mut Worker, ev: Event, ctx: &mut Ctx| {
            let tag: String = ev.get(0)?;
            match tag.as_str() {
                "start" => {
                    for c in 0..w.clients {
                        if w.iters > 0 {
                            let id = w.id_of(c);
                            ctx.send("front", ("acquire", id, w.resource.as_str(), false))?;
                        } else {
                            w.next_phase(c as usize, ctx)?;
                        }
                    }
                    if w.clients <= 0 {
                        w.next_phase(0, ctx)?;
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
                    let c = w.client_of(id)?;
                    w.done[c] += 1;
                    if w.done[c] < w.iters {
                        ctx.send("front", ("acquire", id, w.resource.as_str(), false))?;
                    } else {
                        w.next_phase(c, ctx)?;
                    }
                }
                "granted-all" => {
                    let id: i64 = ev.get(1)?;
                    w.client_of(id)?;
                    let holds = ev.arg(2).ok_or("app: granted-all without holds")?;
                    w.multi_granted(holds)?;
                    ctx.send("front", ("release_all", id))?;
                }
                "released-all" => {
                    let id: i64 = ev.get(1)?;
                    let c = w.client_of(id)?;
                    w.multi_done[c] += 1;
                    w.next_phase(c, ctx)?;
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

/// Gives a worker stage ([`app_stage`]) multi-resource work: after its single-lock
/// increments each client does `rounds` `acquire_all` rounds over `locks` (`(name, k)`, the
/// group's multi locks, at least 2), random subsets seeded by `seed` and the node.
pub fn set_multi_work(stage: &Stage, locks: &[(String, u32)], rounds: usize, seed: u64) {
    let locks: Vec<Value> = locks
        .iter()
        .map(|(n, k)| Value::Array(vec![Value::Str(n.clone()), Value::Int(i64::from(*k))]))
        .collect();
    stage.set_attr("multi", Value::Array(locks));
    stage.set_attr("multi_rounds", rounds as i64);
    stage.set_attr("multi_seed", seed as i64);
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
    for key in ["multi", "multi_rounds", "multi_seed"] {
        if let Some(v) = a.get(key) {
            stage.set_attr(key, v.clone());
        }
    }
    stage.take_pushed();
    Ok(stage)
}

/// The results collector (`done`, serial): after `expected` `("done", node, written,
/// refused[, multi_grants, multi_stale, multi_expected])` reports it quits the run with
/// `("done", written, refused, multi_grants, multi_stale, multi_expected)`, the sums
/// (`multi_expected` an array of `[lock, instances granted]`, see [`decode_multi_report`]).
pub fn done_stage(expected: usize) -> Stage {
    Stage::stateful(
        "done",
        move |_: &Attrs| -> Result<(usize, i64, i64, MultiTally), BoxError> {
            Ok((0, 0, 0, MultiTally::default()))
        },
        move |s: &mut (usize, i64, i64, MultiTally), ev: Event, ctx: &mut Ctx| {
            s.0 += 1;
            s.1 += ev.get::<i64>(2)?;
            s.2 += ev.get::<i64>(3)?;
            s.3.merge(&decode_multi_report(
                ev.args().get(4..).unwrap_or_default(),
            )?);
            if s.0 == expected {
                let t = &s.3;
                let expected: Vec<Value> = t
                    .expected
                    .iter()
                    .map(|(n, k)| Value::Array(vec![Value::Str(n.clone()), Value::Int(*k as i64)]))
                    .collect();
                ctx.quit(
                    Event::new()
                        .with("done")
                        .with(s.1)
                        .with(s.2)
                        .with(t.grants as i64)
                        .with(t.stale as i64)
                        .with(Value::Array(expected)),
                );
            }
            Ok(())
        },
    )
    .serial()
}

/// Reads `[multi_grants, multi_stale, multi_expected]` (the tail of a worker's `done` report
/// or of the collector's quit event; missing values read as none) into a [`MultiTally`]
/// without `written` counts.
pub fn decode_multi_report(args: &[Value]) -> Result<MultiTally, BoxError> {
    let int = |i: usize| -> Result<u64, BoxError> {
        match args.get(i) {
            None | Some(Value::Nil) => Ok(0),
            Some(v) => Ok(v.to::<u64>()?),
        }
    };
    let mut tally = MultiTally {
        grants: int(0)?,
        stale: int(1)?,
        ..MultiTally::default()
    };
    if let Some(v) = args.get(2).filter(|v| !matches!(v, Value::Nil)) {
        for (name, k) in v.to::<Vec<(String, u64)>>()? {
            *tally.expected.entry(name).or_default() += k;
        }
    }
    Ok(tally)
}

/// Why a `--multi-locks` item (`NAME[:K]`) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultiLockSpecError {
    /// No name before the colon.
    #[error("multi lock {0:?}: empty name")]
    EmptyName(String),
    /// `K` is not a positive integer.
    #[error("multi lock {0:?}: the instance count must be an integer ≥ 1")]
    BadCount(String),
}

/// Parses one multi lock `NAME` or `NAME:K` (`K` instances, default 1).
pub fn parse_multi_lock(item: &str) -> Result<(String, u32), MultiLockSpecError> {
    let (name, k) = match item.split_once(':') {
        None => (item.trim(), 1),
        Some((name, k)) => {
            let k = k
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&k| k >= 1)
                .ok_or_else(|| MultiLockSpecError::BadCount(item.to_owned()))?;
            (name.trim(), k)
        }
    };
    if name.is_empty() {
        return Err(MultiLockSpecError::EmptyName(item.to_owned()));
    }
    Ok((name.to_owned(), k))
}

/// The counter file of instance `instance` of multi lock `resource`: `<base>.multi-<resource>-<instance>`.
pub fn multi_counter_path(base: &Path, resource: &str, instance: u32) -> std::path::PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".multi-{resource}-{instance}"));
    std::path::PathBuf::from(name)
}

/// What multi-resource clients did: grants, guarded increments per lock, what the increments
/// should add up to, stale fencing tokens refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MultiTally {
    /// `acquire_all`/`acquire_counts` grants received.
    pub grants: u64,
    /// Increments written per lock (summed over its instances).
    pub written: std::collections::BTreeMap<String, u64>,
    /// Instances granted per lock: what the lock's counter files must add up to.
    pub expected: std::collections::BTreeMap<String, u64>,
    /// Increments refused because the instance's fencing token was not newer than the last one
    /// its counter file recorded (a mutual-exclusion or fencing violation).
    pub stale: u64,
}

impl MultiTally {
    /// Adds another client's tally.
    pub fn merge(&mut self, other: &MultiTally) {
        self.grants += other.grants;
        self.stale += other.stale;
        for (r, n) in &other.written {
            *self.written.entry(r.clone()).or_default() += n;
        }
        for (r, n) in &other.expected {
            *self.expected.entry(r.clone()).or_default() += n;
        }
    }
}

/// Why a multi-resource client stopped.
#[derive(Debug, thiserror::Error)]
pub enum MultiClientError {
    /// Fewer than two multi locks: no subset of size ≥ 2 to ask for.
    #[error("multi-resource clients need at least 2 multi locks, got {0}")]
    TooFewLocks(usize),
    /// A lock call failed.
    #[error("{what}: {source}")]
    Lock {
        /// The call.
        what: String,
        /// The error.
        source: crate::client::LockError,
    },
    /// A counter file could not be read or written.
    #[error(transparent)]
    Counter(#[from] CounterError),
    /// The grant does not hold what was asked for.
    #[error("asked for {asked:?}, granted {granted:?}")]
    WrongGrant {
        /// The request.
        asked: Vec<(String, u32)>,
        /// The instances held.
        granted: Vec<(String, u32)>,
    },
}

/// A random request over `locks` (`(name, instances)`): a subset of at least 2 locks (sorted
/// by name), and for a lock with `k` instances a count in `1..=k`.
pub fn random_request(locks: &[(String, u32)], rng: &mut SplitMix64) -> Vec<(String, u32)> {
    let mut order: Vec<usize> = (0..locks.len()).collect();
    let size = rng.range_inclusive(2.min(locks.len() as u64), locks.len() as u64) as usize;
    for i in 0..size {
        let j = rng.range_inclusive(i as u64, (order.len() - 1) as u64) as usize;
        order.swap(i, j);
    }
    let mut picked: Vec<(String, u32)> = order[..size]
        .iter()
        .map(|&i| {
            let (name, k) = &locks[i];
            (name.clone(), rng.range_inclusive(1, u64::from(*k)) as u32)
        })
        .collect();
    picked.sort();
    picked
}

/// A multi-resource client: `rounds` times, acquires a random subset (size ≥ 2) of `locks`
/// together, then for every instance held does a guarded increment of its counter file
/// ([`multi_counter_path`]) with that instance's fencing token, and releases everything.
pub fn multi_client(
    client: &crate::client::LocalClient,
    locks: &[(String, u32)],
    counter: &Path,
    rounds: usize,
    seed: u64,
    timeout: std::time::Duration,
) -> Result<MultiTally, MultiClientError> {
    if locks.len() < 2 {
        return Err(MultiClientError::TooFewLocks(locks.len()));
    }
    let mut rng = SplitMix64::new(seed);
    let mut tally = MultiTally::default();
    for _ in 0..rounds {
        let asked = random_request(locks, &mut rng);
        let grant =
            client
                .acquire_counts(&asked, timeout)
                .map_err(|source| MultiClientError::Lock {
                    what: format!("acquire_all {asked:?}"),
                    source,
                })?;
        tally.grants += 1;
        let mut granted: Vec<(String, u32)> = vec![];
        for h in &grant.holds {
            match granted.last_mut() {
                Some((r, n)) if *r == h.resource => *n += 1,
                _ => granted.push((h.resource.clone(), 1)),
            }
        }
        granted.sort();
        if granted != asked {
            return Err(MultiClientError::WrongGrant { asked, granted });
        }
        for h in &grant.holds {
            *tally.expected.entry(h.resource.clone()).or_default() += 1;
            let path = multi_counter_path(counter, &h.resource, h.instance);
            if bump_counter(&path, h.fencing_token)? {
                *tally.written.entry(h.resource.clone()).or_default() += 1;
            } else {
                tracing::error!(
                    resource = %h.resource,
                    instance = h.instance,
                    fence = h.fencing_token,
                    "stale fencing token refused"
                );
                tally.stale += 1;
            }
        }
        client
            .release_all(grant)
            .map_err(|source| MultiClientError::Lock {
                what: format!("release_all {asked:?}"),
                source,
            })?;
    }
    Ok(tally)
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

    #[test]
    fn multi_lock_items_parse_with_typed_errors() {
        assert_eq!(parse_multi_lock("a").unwrap(), ("a".into(), 1));
        assert_eq!(parse_multi_lock("gpu:3").unwrap(), ("gpu".into(), 3));
        assert_eq!(
            parse_multi_lock(":2"),
            Err(MultiLockSpecError::EmptyName(":2".into()))
        );
        for bad in ["a:0", "a:x", "a:", "a:-1"] {
            assert_eq!(
                parse_multi_lock(bad),
                Err(MultiLockSpecError::BadCount(bad.into()))
            );
        }
    }

    #[test]
    fn random_requests_pick_two_or_more_distinct_locks_within_capacity() {
        let locks: Vec<(String, u32)> = vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 1)];
        let mut rng = SplitMix64::new(7);
        let mut sizes = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let req = random_request(&locks, &mut rng);
            assert!(req.len() >= 2, "{req:?}");
            assert!(req.windows(2).all(|w| w[0].0 < w[1].0), "sorted, distinct");
            for (name, n) in &req {
                let k = locks.iter().find(|l| &l.0 == name).unwrap().1;
                assert!((1..=k).contains(n), "{name}: {n} of {k}");
            }
            sizes.insert(req.len());
        }
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![2, 3]);
        let base = Path::new("/tmp/c");
        assert_eq!(
            multi_counter_path(base, "gpu", 2),
            Path::new("/tmp/c.multi-gpu-2")
        );
    }
}

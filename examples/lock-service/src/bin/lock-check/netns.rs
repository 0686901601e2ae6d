//! One network namespace per node, so that a node can be cut off: a bridge in this
//! namespace, and per node a namespace with one end of a veth pair (the other end on the
//! bridge) holding the node's address. Cutting a node off sets its bridge-side link down:
//! nothing leaves or reaches it (peers and clients alike) until it is set up again. Only the
//! run's own interfaces and namespaces are touched, all named after the run; they are
//! removed on drop. Needs root and `ip` (iproute2).

use std::process::Command;

use anyhow::{Context, bail};

/// The namespaces of one run.
pub struct Netns {
    tag: String,
    subnet: u8,
    n: usize,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    /// `Some(why not)` if this process cannot make namespaces.
    pub fn unavailable() -> Option<&'static str> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not root");
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Some("no ip command (iproute2)");
        }
        None
    }

    /// Makes the bridge and `n` namespaces.
    pub fn create(n: usize) -> anyhow::Result<Netns> {
        let pid = std::process::id();
        let net = Netns {
            tag: format!("lc{}", pid % 100_000),
            subnet: (pid % 200) as u8 + 20,
            n,
        };
        net.setup().inspect_err(|_| net.teardown())?;
        Ok(net)
    }

    fn setup(&self) -> anyhow::Result<()> {
        let br = self.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("10.213.{}.1/24", self.subnet),
            "dev",
            &br,
        ])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..self.n {
            let (ns, host, inner) = (self.name(i), self.host_link(i), self.inner_link(i));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &host, "master", &br, "up"])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            let addr = format!("{}/24", self.ip(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn teardown(&self) {
        for i in 0..self.n {
            let _ = ip(&["netns", "del", &self.name(i)]);
            let _ = ip(&["link", "del", &self.host_link(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    fn host_link(&self, i: usize) -> String {
        format!("{}h{i}", self.tag)
    }

    fn inner_link(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    /// Node `i`'s namespace.
    pub fn name(&self, i: usize) -> String {
        format!("{}-{i}", self.tag)
    }

    /// Node `i`'s address.
    pub fn ip(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.subnet, 10 + i)
    }

    /// The argv prefix that runs a program in node `i`'s namespace.
    pub fn exec(&self, i: usize) -> Vec<String> {
        ["ip", "netns", "exec"]
            .iter()
            .map(|s| s.to_string())
            .chain([self.name(i)])
            .collect()
    }

    /// Cuts node `i` off (`true`) or lets it back (`false`).
    pub fn cut(&self, i: usize, off: bool) -> anyhow::Result<()> {
        ip(&[
            "link",
            "set",
            &self.host_link(i),
            if off { "down" } else { "up" },
        ])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.teardown();
    }
}

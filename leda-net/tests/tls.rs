//! TLS between processes, on loopback: mutual certificates of one CA. A run crosses
//! TLS intact (large binaries through the vectored path too); a launcher without TLS,
//! or with a certificate of another CA, is refused.

mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use common::pki::pki;
use common::{Node, scratch};
use leda_core::prelude::*;
use leda_net::{Launcher, NetError};

const ME: &str = "launcher:1";

/// 200 events of 70 KB (spliced binaries) from the launcher to a drain on the daemon.
fn run(node: &Node, launcher: Launcher) -> Result<i64, NetError> {
    let gen_ = stages::generator("gen");
    let drain = stages::drain("drain").attr("expect", 200);
    let mut g = Graph::new("tls");
    g.connect(&gen_, 1, &drain);
    g.part([Cluster::of([&gen_]), Cluster::of([&drain])])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    gen_.push((200, 70_000, false));
    let r = launcher.run(&g, Run::default().threads(2))?;
    Ok(r.run
        .quit
        .and_then(|q| q.arg(0).and_then(Value::as_int))
        .unwrap_or(-1))
}

#[test]
fn runs_over_mutual_tls_and_refuses_others() {
    let dir = scratch("tls");
    let ours = pki(&dir, "ours");
    let node = Node::daemon(&[], Some(&ours));
    assert_eq!(
        run(&node, Launcher::new(ME).tls(ours.clone())).expect("a run over TLS"),
        200
    );
    // No TLS: the daemon's TLS handshake fails, nothing is deployed.
    let plain = run(&node, Launcher::new(ME)).expect_err("plain TCP refused");
    assert!(
        matches!(
            plain,
            NetError::Frame { .. }
                | NetError::Protocol { .. }
                | NetError::Auth { .. }
                | NetError::Timeout { .. }
        ),
        "{plain}"
    );
    // A certificate of another CA: refused by TLS.
    let theirs = pki(&dir, "theirs");
    let other = run(&node, Launcher::new(ME).tls(theirs)).expect_err("another CA refused");
    assert!(
        matches!(&other, NetError::Auth { reason, .. } if reason.contains("TLS")),
        "{other}"
    );
    // The daemon still serves over TLS.
    assert_eq!(run(&node, Launcher::new(ME).tls(ours)).expect("again"), 200);
}

//! Scripted interleavings from the spec (slide 42 deadlock, Sanders' Situation A, the Li–Hudak
//! slide-27 race), API/serde checks, and a check that the checker catches a broken algorithm.

use serde::{Deserialize, Serialize};

use leda_mutex::algo::*;
use leda_mutex::{
    Channels, Message, MutexError, MutexNode, NodeId, Outbox, Output, SimConfig, Verdict,
    Violation, simulate,
};

/// A hand-driven network: messages wait in `inflight` until a test delivers them, in any order.
struct Pool<A: MutexNode> {
    nodes: Vec<A>,
    inflight: Vec<(NodeId, NodeId, A::Msg)>,
    grants: Vec<(NodeId, u64)>,
    out: Outbox<A::Msg>,
}

impl<A: MutexNode> Pool<A> {
    fn new(n: usize, cfg: &A::Config) -> Self {
        Self {
            nodes: (0..n)
                .map(|i| A::new(i, n, cfg).expect("valid config"))
                .collect(),
            inflight: Vec::new(),
            grants: Vec::new(),
            out: Outbox::new(),
        }
    }

    fn apply(&mut self, i: NodeId) {
        for o in self.out.drain() {
            match o {
                Output::Send { to, msg } => self.inflight.push((i, to, msg)),
                Output::Grant { fence } => self.grants.push((i, fence)),
                Output::Local { .. } => {}
            }
        }
    }

    fn request(&mut self, i: NodeId) {
        self.nodes[i].on_request(&mut self.out).expect("request");
        self.apply(i);
    }

    fn release(&mut self, i: NodeId) {
        self.nodes[i].on_release(&mut self.out).expect("release");
        self.apply(i);
    }

    /// Delivers the oldest in-flight message `from → to` of kind `kind`.
    fn deliver(&mut self, from: NodeId, to: NodeId, kind: &str) {
        let idx = self
            .inflight
            .iter()
            .position(|(f, t, m)| *f == from && *t == to && m.kind() == kind)
            .unwrap_or_else(|| panic!("no {kind} message {from} -> {to} in flight"));
        let (f, t, m) = self.inflight.remove(idx);
        self.nodes[t]
            .on_message(f, m, &mut self.out)
            .expect("message");
        self.apply(t);
    }

    /// Delivers everything, oldest first, until nothing is in flight.
    fn deliver_all(&mut self) {
        while !self.inflight.is_empty() {
            let (f, t, m) = self.inflight.remove(0);
            self.nodes[t]
                .on_message(f, m, &mut self.out)
                .expect("message");
            self.apply(t);
        }
    }

    fn granted(&self) -> Vec<NodeId> {
        self.grants.iter().map(|g| g.0).collect()
    }
}

fn example_quorums() -> Vec<Vec<usize>> {
    vec![vec![0, 1, 2], vec![0, 1, 3], vec![0, 2, 3], vec![1, 2, 3]]
}

/// Spec §12.1 slide 42 (0-based: P1 = 0, P2 = 1, P3 = 2, P4 = 3).
fn slide_42(variant: MaekawaVariant) -> Pool<Maekawa> {
    let cfg = MaekawaConfig {
        variant,
        quorums: Some(example_quorums()),
    };
    let mut p = Pool::<Maekawa>::new(4, &cfg);
    p.request(0);
    p.request(3);
    p.deliver(0, 1, "request"); // P2 receives REQ1 then REQ4: votes for P1
    p.deliver(3, 1, "request");
    p.deliver(3, 2, "request"); // P3 receives REQ4 then REQ1: votes for P4
    p.deliver(0, 2, "request");
    p.deliver_all();
    p
}

#[test]
fn slide_42_deadlocks_naive_voting() {
    let p = slide_42(MaekawaVariant::Naive);
    assert!(p.inflight.is_empty());
    assert!(
        p.grants.is_empty(),
        "naive voting must deadlock here: {:?}",
        p.grants
    );
}

#[test]
fn slide_42_is_resolved_by_sanders() {
    let mut p = slide_42(MaekawaVariant::Sanders);
    // (1, P1) < (1, P4): P3 reclaims its vote with INQ, P4 relinquishes, P1 enters.
    assert_eq!(p.granted(), vec![0]);
    p.release(0);
    p.deliver_all();
    assert_eq!(p.granted(), vec![0, 3]);
    assert!(p.grants[0].1 < p.grants[1].1);
}

#[test]
fn sanders_situation_a_ignores_late_inquiries() {
    let cfg = MaekawaConfig {
        variant: MaekawaVariant::Sanders,
        quorums: Some(example_quorums()),
    };
    let mut p = Pool::<Maekawa>::new(4, &cfg);
    p.request(0); // A = P1, stamp (1, 0): the earlier request
    p.request(3); // B = P4, stamp (1, 3)
    // B's requests arrive first everywhere and B collects all its votes.
    p.deliver(3, 1, "request");
    p.deliver(3, 2, "request");
    p.deliver(1, 3, "yes");
    p.deliver(2, 3, "yes");
    assert_eq!(p.granted(), vec![3]);
    // A's requests now reach the voters of B, which inquire; B is in the CS and ignores them.
    p.deliver(0, 1, "request");
    p.deliver(0, 2, "request");
    p.deliver(1, 3, "inquire");
    p.deliver(2, 3, "inquire");
    assert!(p.inflight.is_empty(), "no RELINQUISH from a node in the CS");
    p.release(3);
    p.deliver_all();
    // Served B then A although A's request is earlier: no ordered service (spec §13).
    assert_eq!(p.granted(), vec![3, 0]);
}

#[test]
fn naimi_trehel_slide_27_race_is_harmless() {
    // A = 0 holds the token; build the chain C -> token, then D and E request "at once".
    let mut p = Pool::<NaimiTrehel>::new(5, &NaimiTrehelConfig::default());
    p.request(1);
    p.deliver_all();
    p.release(1);
    p.request(2);
    p.deliver_all();
    p.release(2);
    assert_eq!(p.granted(), vec![1, 2]);
    p.request(3); // D
    p.request(4); // E, right after
    // REQ E overtakes REQ D at A, and REQ D reaches E before REQ E reaches the holder C.
    p.deliver(4, 0, "request");
    p.deliver(3, 0, "request");
    p.deliver(0, 4, "request");
    p.deliver(0, 2, "request");
    p.deliver_all();
    assert_eq!(p.granted(), vec![1, 2, 4]);
    p.release(4);
    p.deliver_all();
    assert_eq!(p.granted(), vec![1, 2, 4, 3]);
    p.release(3);
    let holders = p.nodes.iter().filter(|n| n.holds_token()).count();
    assert_eq!(holders, 1);
    let fences: Vec<u64> = p.grants.iter().map(|g| g.1).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn roucairol_carvalho_reuses_permissions() {
    let mut p = Pool::<RoucairolCarvalho>::new(3, &RoucairolCarvalhoConfig);
    // Node 0 holds every permission initially: 0 messages.
    p.request(0);
    assert!(p.inflight.is_empty());
    p.release(0);
    p.request(2);
    assert_eq!(p.inflight.len(), 2);
    p.deliver_all();
    assert_eq!(p.granted(), vec![0, 2]);
    p.release(2);
    p.request(2);
    assert!(
        p.inflight.is_empty(),
        "permissions stay valid until someone asks"
    );
    assert_eq!(p.granted(), vec![0, 2, 2]);
}

#[test]
fn roucairol_carvalho_request_overtaking_reply() {
    // Node 1 asks 0 for the permission; 0 replies; then 0 requests again and its REQUEST
    // overtakes the REPLY it sent (non-FIFO). Node 1 must not duplicate the permission.
    let mut p = Pool::<RoucairolCarvalho>::new(2, &RoucairolCarvalhoConfig);
    p.request(1);
    p.deliver(1, 0, "request"); // 0 gives the permission: REPLY 0 -> 1 in flight
    p.request(0); // 0 asks it back: REQUEST 0 -> 1 in flight, behind the REPLY
    // The REQUEST overtakes the REPLY. It is stamped after 0 saw 1's request, so 1 (waiting, with
    // priority) defers it instead of answering with a permission it does not hold yet.
    p.deliver(0, 1, "request");
    assert!(
        p.inflight.iter().all(|(f, _, _)| *f == 0),
        "node 1 sent nothing"
    );
    p.deliver_all();
    assert_eq!(p.granted(), vec![1]);
    p.release(1);
    p.deliver_all();
    assert_eq!(p.granted(), vec![1, 0]);
    assert!(p.nodes[0].is_authorized(1) ^ p.nodes[1].is_authorized(0));
}

#[test]
fn centralized_serves_in_arrival_order() {
    let mut p = Pool::<Centralized>::new(4, &CentralizedConfig { coordinator: 0 });
    p.request(0); // the coordinator's own request: granted locally, no message
    assert!(p.inflight.is_empty());
    for j in [3, 1, 2] {
        p.request(j);
        p.deliver(j, 0, "request");
    }
    p.release(0);
    for j in [3, 1, 2] {
        p.deliver_all();
        assert_eq!(p.granted().last(), Some(&j));
        p.release(j);
    }
    p.deliver_all();
    assert_eq!(p.granted(), vec![0, 3, 1, 2]);
    let fences: Vec<u64> = p.grants.iter().map(|g| g.1).collect();
    assert_eq!(fences, vec![1, 2, 3, 4]);
}

// ---------------------------------------------------------------------------------------------
// API, errors and serde.

#[test]
fn misuse_is_a_typed_error() {
    let mut out = Outbox::new();
    let mut ra = RicartAgrawala::new(0, 3, &RicartAgrawalaConfig).expect("valid");
    assert_eq!(
        ra.on_release(&mut out),
        Err(MutexError::NotHolding { node: 0 })
    );
    ra.on_request(&mut out).expect("first request");
    assert_eq!(
        ra.on_request(&mut out),
        Err(MutexError::AlreadyRequesting { node: 0 })
    );
    assert!(matches!(
        ra.on_message(7, RicartAgrawalaMsg::Reply { ts: 1 }, &mut out),
        Err(MutexError::UnknownNode { node: 7, n: 3 })
    ));
    assert!(matches!(
        ra.on_timer(1, &mut out),
        Err(MutexError::UnknownTimer { .. })
    ));
    assert!(matches!(
        ra.on_failure(2, &mut out),
        Err(MutexError::FailureNotTolerated { .. })
    ));
    assert!(matches!(
        TokenRing::new(0, 3, &TokenRingConfig::default())
            .expect("valid")
            .on_message(2, TokenRingMsg::Token { fence: 0 }, &mut Outbox::new()),
        Err(MutexError::Protocol { .. })
    ));
    assert!(Centralized::new(0, 0, &CentralizedConfig::default()).is_err());
    assert!(Centralized::new(0, 2, &CentralizedConfig { coordinator: 5 }).is_err());
    assert!(Raymond::new(0, 2, &RaymondConfig { arity: 0 }).is_err());
    let bad = MaekawaConfig {
        variant: MaekawaVariant::Sanders,
        quorums: Some(vec![vec![0], vec![1]]),
    };
    assert!(matches!(
        Maekawa::new(0, 2, &bad),
        Err(MutexError::Config(_))
    ));
}

fn roundtrip<M: Message + PartialEq>(msgs: &[M]) {
    for m in msgs {
        let bytes = rmp_serde::to_vec(m).expect("encode");
        let back: M = rmp_serde::from_slice(&bytes).expect("decode");
        assert_eq!(&back, m);
        assert!(!m.kind().is_empty());
    }
}

#[test]
fn messages_roundtrip_through_msgpack() {
    roundtrip(&[
        CentralizedMsg::Request,
        CentralizedMsg::Grant { fence: 9 },
        CentralizedMsg::Release,
    ]);
    roundtrip(&[TokenRingMsg::Token { fence: 3 }]);
    roundtrip(&[
        MisraMsg::T1 { val: 4, fence: 2 },
        MisraMsg::T2 { val: -4, fence: 2 },
    ]);
    roundtrip(&[
        LamportMsg::Request { ts: 1 },
        LamportMsg::Reply { ts: 2 },
        LamportMsg::Release { req_ts: 1, ts: 3 },
    ]);
    roundtrip(&[
        RicartAgrawalaMsg::Request { ts: 1 },
        RicartAgrawalaMsg::Reply { ts: 2 },
    ]);
    roundtrip(&[
        RoucairolCarvalhoMsg::Request { ts: 1 },
        RoucairolCarvalhoMsg::Reply { ts: 2, fence: 7 },
    ]);
    roundtrip(&[
        SuzukiKasamiMsg::Request { seq: 3 },
        SuzukiKasamiMsg::Token(SkToken {
            ln: vec![1, 2, 3],
            queue: [2, 0].into_iter().collect(),
            fence: 5,
        }),
    ]);
    roundtrip(&[RaymondMsg::Request, RaymondMsg::Token { fence: 1 }]);
    roundtrip(&[
        NaimiTrehelMsg::Request { requester: 3 },
        NaimiTrehelMsg::Token { fence: 1 },
    ]);
    roundtrip(&[
        MaekawaMsg::Request { ts: 1 },
        MaekawaMsg::Yes { fence: 0 },
        MaekawaMsg::Inquire { ts: 1 },
        MaekawaMsg::Relinquish,
        MaekawaMsg::Release { fence: 2 },
    ]);
}

// ---------------------------------------------------------------------------------------------
// The checker has teeth: a deliberately broken algorithm written against the public trait.

/// "Ricart–Agrawala" that forgets to defer while in the CS.
#[derive(Debug)]
struct Careless {
    id: NodeId,
    n: usize,
    waiting: usize,
    requesting: bool,
    fence: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum CarelessMsg {
    Ask,
    Ok,
}

impl Message for CarelessMsg {
    fn kind(&self) -> &'static str {
        match self {
            CarelessMsg::Ask => "ask",
            CarelessMsg::Ok => "ok",
        }
    }
}

impl MutexNode for Careless {
    type Msg = CarelessMsg;
    type Config = ();
    const NAME: &'static str = "careless";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, _: &()) -> Result<Self, MutexError> {
        Ok(Self {
            id,
            n,
            waiting: 0,
            requesting: false,
            fence: 0,
        })
    }
    fn id(&self) -> NodeId {
        self.id
    }
    fn on_request(&mut self, out: &mut Outbox<CarelessMsg>) -> Result<(), MutexError> {
        self.requesting = true;
        self.waiting = self.n - 1;
        (0..self.n)
            .filter(|&j| j != self.id)
            .for_each(|j| out.send(j, CarelessMsg::Ask));
        if self.waiting == 0 {
            self.fence += 1;
            out.grant(self.fence);
        }
        Ok(())
    }
    fn on_release(&mut self, _: &mut Outbox<CarelessMsg>) -> Result<(), MutexError> {
        self.requesting = false;
        Ok(())
    }
    fn on_message(
        &mut self,
        from: NodeId,
        msg: CarelessMsg,
        out: &mut Outbox<CarelessMsg>,
    ) -> Result<(), MutexError> {
        match msg {
            CarelessMsg::Ask => out.send(from, CarelessMsg::Ok),
            CarelessMsg::Ok => {
                self.waiting -= 1;
                if self.waiting == 0 && self.requesting {
                    self.fence += 1;
                    out.grant(self.fence);
                }
            }
        }
        Ok(())
    }
}

#[test]
fn checker_catches_a_careless_algorithm() {
    let caught = (0..50).any(|seed| {
        let mut cfg = SimConfig::new(3, seed);
        cfg.channels = Channels::NonFifo;
        cfg.workload.think_time = leda_mutex::Latency::Uniform { min: 0, max: 2 };
        matches!(
            simulate::<Careless>(cfg, &()).expect("valid").verdict,
            Verdict::Violation(
                Violation::MutualExclusion { .. } | Violation::FenceNotIncreasing { .. }
            )
        )
    });
    assert!(caught);
}

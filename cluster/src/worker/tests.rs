//! The worker's rules, driven event by event on explicit time.

use std::time::Duration;

use veriflow_runtime::transport::{Envelope, Message};
use veriflow_runtime::{Epoch, VnodeId};

use super::*;
use crate::coordinator::link_key;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const SECRET: [u8; 32] = [3; 32];

fn peer(me: WorkerId, id: WorkerId) -> PeerInfo {
    PeerInfo {
        id,
        addr: format!("127.0.0.1:{}", 9000 + id),
        link_key: link_key(&SECRET, me, id),
    }
}

fn env() -> Envelope {
    Envelope {
        from: VnodeId(0),
        epoch: Epoch(0),
        msg: Message::StealRequest,
    }
}

/// Worker 1 of workers 1-3, started on job 7 hosting vnode 0; vnode 1 on worker 2, vnode 2
/// not mapped yet.
fn started() -> WorkerCore {
    let mut w = WorkerCore::new(1, crate::test_fd(), ms(0));
    let a = w.on_event(
        ms(1),
        Event::FromCoord(ToWorker::Start {
            job: 7,
            spec: JobSpec {
                argv: vec![],
                vnodes: 3,
                min_workers: 1,
                iterative: false,
            },
            vnodes: 3,
            hosted: vec![(0, 0)],
            starts: true,
            map: vec![(0, 1, 0), (1, 2, 0)],
            peers: vec![peer(1, 2), peer(1, 3)],
        }),
    );
    assert!(a.iter().any(|a| matches!(
        a,
        Action::StartJob {
            job: 7,
            starts: true,
            ..
        }
    )));
    w
}

/// Issue 13: any key holder could open a worker's peer port and claim to be worker N.
#[test]
fn a_peer_hello_must_prove_its_claim_with_the_link_key_over_this_connection() {
    let w = started();
    let binding = [9u8; 32];
    let good = hello_proof(&link_key(&SECRET, 2, 1), &binding, 2, 1);
    assert!(w.check_hello(2, 1, &good, &binding).is_ok());
    // Replayed on another connection (another channel binding).
    assert!(w.check_hello(2, 1, &good, &[8u8; 32]).is_err());
    // Worker 3 claiming to be worker 2 with its own link key.
    let forged = hello_proof(&link_key(&SECRET, 3, 1), &binding, 2, 1);
    let err = w.check_hello(2, 1, &forged, &binding).unwrap_err();
    assert!(err.contains("without its link key"), "{err}");
    // A stranger, and a hello meant for another worker.
    assert!(w.check_hello(44, 1, &good, &binding).is_err());
    assert!(w.check_hello(2, 3, &good, &binding).is_err());
}

#[test]
fn messages_for_unmapped_vnodes_are_held_until_the_map_names_their_host() {
    let mut w = started();
    let a = w.on_event(ms(2), Event::Outbound { to: 2, env: env() });
    assert!(
        a.iter().all(|a| !matches!(a, Action::ToPeer { .. })),
        "{a:?}"
    );
    let a = w.on_event(ms(2), Event::Outbound { to: 1, env: env() });
    assert!(a.iter().any(|a| matches!(
        a,
        Action::ToPeer {
            worker: 2,
            frame: Peer::Msg { to: 1, .. },
            ..
        }
    )));
    let a = w.on_event(
        ms(3),
        Event::FromCoord(ToWorker::Map {
            job: 7,
            map: vec![(2, 3, 1)],
            peers: vec![peer(1, 2), peer(1, 3)],
        }),
    );
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::ToPeer {
                worker: 3,
                frame: Peer::Msg { to: 2, .. },
                ..
            }
        )),
        "the held message goes to the new host: {a:?}"
    );
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Control {
            job: 7,
            order: Control::Epoch(VnodeId(2), Epoch(1))
        }
    )));
}

#[test]
fn frames_for_vnodes_hosted_here_are_delivered_and_others_forwarded_by_the_map() {
    let mut w = started();
    let a = w.on_event(
        ms(2),
        Event::FromPeer {
            from: 2,
            frame: Peer::Msg { to: 0, env: env() },
        },
    );
    assert!(
        matches!(a.as_slice(), [Action::Deliver { to: 0, .. }, ..]),
        "{a:?}"
    );
    let a = w.on_event(
        ms(2),
        Event::FromPeer {
            from: 3,
            frame: Peer::Msg { to: 1, env: env() },
        },
    );
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::ToPeer { worker: 2, .. })),
        "{a:?}"
    );
    // A vnode given to us (Host) is delivered here from then on.
    let _ = w.on_event(
        ms(3),
        Event::FromCoord(ToWorker::Host {
            job: 7,
            vnode: 2,
            epoch: 1,
        }),
    );
    let a = w.on_event(
        ms(3),
        Event::FromPeer {
            from: 3,
            frame: Peer::Msg { to: 2, env: env() },
        },
    );
    assert!(
        a.iter().any(|a| matches!(a, Action::Deliver { to: 2, .. })),
        "{a:?}"
    );
}

#[test]
fn a_closed_peer_link_is_reported_broken_to_the_coordinator_and_a_refusal_exits() {
    let mut w = started();
    let a = w.on_event(ms(5), Event::PeerClosed { peer: 2 });
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::ToCoord(ToCoord::Broken { worker: 2 }))),
        "{a:?}"
    );
    let a = w.on_event(
        ms(6),
        Event::FromCoord(ToWorker::Refused {
            reason: "no".into(),
        }),
    );
    assert!(a.iter().any(|a| matches!(a, Action::Exit(_))));
}

#[test]
fn heartbeats_go_to_the_coordinator_and_to_peers_on_time() {
    let mut w = started();
    let mut to_coord = 0;
    let mut to_peers = 0;
    let mut now = ms(0);
    while now < ms(1000) {
        for a in w.on_event(now, Event::Tick) {
            match a {
                Action::ToCoord(ToCoord::Heartbeat(_)) => to_coord += 1,
                Action::ToPeer {
                    frame: Peer::Heartbeat(_),
                    ..
                } => to_peers += 1,
                _ => {}
            }
        }
        now += ms(10);
    }
    assert!(to_coord >= 2, "{to_coord}");
    assert!(to_peers >= 4, "{to_peers}");
}

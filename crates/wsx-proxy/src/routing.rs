//! Where a new connection goes: the routing decision, as a pure function of what the
//! gateway knows about the connection's peer at that moment.
//!
//! ```text
//!  no free session slot ───────────────────> bypass (session limit reached)
//!  no peer serves the destination ─────────> bypass (no peer)
//!  the peer's bypass is forced ────────────> bypass (forced)
//!  the peer has a usable tunnel ───────────> its tunnel
//!  its secondary (not forced) has one ─────> the secondary's tunnel
//!  on_failure = reject ────────────────────> reject
//!  on_failure = bypass ────────────────────> bypass (peer down)
//! ```
//!
//! The decision is generic over the tunnel (the gateway passes a tunnel and the peer's
//! codec; tests pass anything), so every branch is tested without a network.

use crate::peers::FailurePolicy;
use std::net::IpAddr;
use wsx_tunnel::Target;

/// Whether `target`, named by a forwarding listener or a SOCKS client, means a host only
/// the far gateway can reach by that name: a loopback, link-local or unspecified address,
/// or `localhost`. Such a session is never relayed directly from here (a bypass, or a
/// scenario that relays directly): this gateway would reach itself, or a neighbour of its
/// own, instead of the host meant. It is refused when the tunnel cannot carry it.
pub(crate) fn far_side_only(target: &Target) -> bool {
    match target {
        Target::Addr(addr) => match addr.ip() {
            IpAddr::V4(ip) => ip.is_loopback() || ip.is_link_local() || ip.is_unspecified(),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
                None => ip.is_loopback() || ip.is_unicast_link_local() || ip.is_unspecified(),
            },
        },
        Target::Name { host, .. } => {
            let host = host.trim_end_matches('.').to_ascii_lowercase();
            host == "localhost" || host.ends_with(".localhost")
        }
    }
}

/// A peer as routing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate<T> {
    pub(crate) name: String,
    pub(crate) force_bypass: bool,
    /// The tunnel for new streams, if the peer is healthy.
    pub(crate) tunnel: Option<T>,
    /// The peer that takes this one's connections while it is down.
    pub(crate) secondary: Option<String>,
    pub(crate) on_failure: FailurePolicy,
}

/// Where a new connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision<T> {
    /// Through `peer`'s tunnel (the connection's own peer, or its secondary).
    Tunnel { peer: String, tunnel: T },
    /// Directly to the destination, unaccelerated.
    Bypass {
        peer: Option<String>,
        reason: BypassReason,
    },
    /// Refused: the peer is down and its policy says so.
    Reject { peer: String },
}

/// Why a connection bypasses the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BypassReason {
    /// The gateway carries as many sessions as it may.
    SessionLimit,
    /// No peer serves the destination.
    NoPeer,
    /// The operator forced the peer's connections to go direct.
    Forced,
    /// The peer (and its secondary, if any) has no usable tunnel, and its policy is to
    /// bypass.
    PeerDown,
}

impl BypassReason {
    /// For logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BypassReason::SessionLimit => "session limit reached",
            BypassReason::NoPeer => "no peer serves the destination",
            BypassReason::Forced => "bypass forced",
            BypassReason::PeerDown => "peer down",
        }
    }
}

/// The decision for a connection whose peer is `peer` (`None`: no peer serves it), given
/// whether a session slot is free. `secondary` looks a peer up by name; it is called only
/// when the peer itself cannot carry the connection and names a secondary.
pub(crate) fn decide<T>(
    slot_free: bool,
    peer: Option<Candidate<T>>,
    secondary: impl FnOnce(&str) -> Option<Candidate<T>>,
) -> Decision<T> {
    if !slot_free {
        return Decision::Bypass {
            peer: None,
            reason: BypassReason::SessionLimit,
        };
    }
    let Some(peer) = peer else {
        return Decision::Bypass {
            peer: None,
            reason: BypassReason::NoPeer,
        };
    };
    if peer.force_bypass {
        return Decision::Bypass {
            peer: Some(peer.name),
            reason: BypassReason::Forced,
        };
    }
    if let Some(tunnel) = peer.tunnel {
        return Decision::Tunnel {
            peer: peer.name,
            tunnel,
        };
    }
    let takeover = (peer.secondary.as_deref())
        .and_then(secondary)
        .filter(|s| !s.force_bypass)
        .and_then(|s| Some((s.name, s.tunnel?)));
    if let Some((name, tunnel)) = takeover {
        return Decision::Tunnel { peer: name, tunnel };
    }
    match peer.on_failure {
        FailurePolicy::Reject => Decision::Reject { peer: peer.name },
        FailurePolicy::Bypass => Decision::Bypass {
            peer: Some(peer.name),
            reason: BypassReason::PeerDown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_only_the_far_side_means_are_recognised() {
        let addr = |a: &str| Target::Addr(a.parse().unwrap_or_else(|e| panic!("{a}: {e}")));
        let name = |h: &str| Target::Name {
            host: h.into(),
            port: 80,
        };
        for local in [
            addr("127.0.0.1:5201"),
            addr("127.8.0.1:80"),
            addr("[::1]:80"),
            addr("[::ffff:127.0.0.1]:80"),
            addr("169.254.1.1:80"),
            addr("[fe80::1]:80"),
            addr("0.0.0.0:80"),
            name("localhost"),
            name("LOCALHOST."),
            name("db.localhost"),
        ] {
            assert!(far_side_only(&local), "{local:?}");
        }
        for remote in [
            addr("10.71.2.2:5201"),
            addr("[fd00::1]:80"),
            name("intranet.site-b"),
            name("localhost.example.com"),
        ] {
            assert!(!far_side_only(&remote), "{remote:?}");
        }
    }

    /// A healthy peer whose tunnel is `tunnel`.
    fn up(name: &str, tunnel: u32) -> Candidate<u32> {
        Candidate {
            name: name.into(),
            force_bypass: false,
            tunnel: Some(tunnel),
            secondary: None,
            on_failure: FailurePolicy::Bypass,
        }
    }

    /// A peer without a usable tunnel.
    fn down(name: &str) -> Candidate<u32> {
        Candidate {
            tunnel: None,
            ..up(name, 0)
        }
    }

    fn forced(mut c: Candidate<u32>) -> Candidate<u32> {
        c.force_bypass = true;
        c
    }

    fn with_secondary(mut c: Candidate<u32>, secondary: &str) -> Candidate<u32> {
        c.secondary = Some(secondary.into());
        c
    }

    fn rejecting(mut c: Candidate<u32>) -> Candidate<u32> {
        c.on_failure = FailurePolicy::Reject;
        c
    }

    fn no_lookup(name: &str) -> Option<Candidate<u32>> {
        panic!("the secondary {name} was looked up")
    }

    fn tunnel(peer: &str, tunnel: u32) -> Decision<u32> {
        Decision::Tunnel {
            peer: peer.into(),
            tunnel,
        }
    }

    fn bypass(peer: Option<&str>, reason: BypassReason) -> Decision<u32> {
        Decision::Bypass {
            peer: peer.map(Into::into),
            reason,
        }
    }

    #[test]
    fn a_healthy_peer_carries_the_connection_without_asking_its_secondary() {
        let peer = with_secondary(up("hq", 7), "dr");
        assert_eq!(decide(true, Some(peer), no_lookup), tunnel("hq", 7));
    }

    #[test]
    fn without_a_peer_the_connection_bypasses() {
        assert_eq!(
            decide(true, None, no_lookup),
            bypass(None, BypassReason::NoPeer)
        );
    }

    #[test]
    fn a_full_gateway_bypasses_whatever_the_peer_and_its_policy() {
        for peer in [
            Some(up("hq", 1)),
            Some(rejecting(down("hq"))),
            Some(forced(up("hq", 1))),
            None,
        ] {
            assert_eq!(
                decide(false, peer, no_lookup),
                bypass(None, BypassReason::SessionLimit)
            );
        }
    }

    #[test]
    fn forced_bypass_wins_over_a_healthy_tunnel_and_a_reject_policy() {
        let peer = rejecting(with_secondary(forced(up("hq", 1)), "dr"));
        assert_eq!(
            decide(true, Some(peer), no_lookup),
            bypass(Some("hq"), BypassReason::Forced)
        );
    }

    #[test]
    fn a_healthy_secondary_takes_over_a_down_peer() {
        let peer = with_secondary(down("hq"), "dr");
        let lookup = |name: &str| (name == "dr").then(|| up("dr", 9));
        assert_eq!(decide(true, Some(peer), lookup), tunnel("dr", 9));
    }

    #[test]
    fn a_down_or_forced_or_missing_secondary_leaves_the_peer_to_its_policy() {
        let secondaries = [Some(down("dr")), Some(forced(up("dr", 9))), None];
        for secondary in secondaries {
            let peer = with_secondary(down("hq"), "dr");
            assert_eq!(
                decide(true, Some(peer), |_| secondary.clone()),
                bypass(Some("hq"), BypassReason::PeerDown)
            );
            let peer = rejecting(with_secondary(down("hq"), "dr"));
            assert_eq!(
                decide(true, Some(peer), |_| secondary.clone()),
                Decision::Reject { peer: "hq".into() }
            );
        }
    }

    #[test]
    fn a_down_peer_without_a_secondary_follows_its_policy() {
        assert_eq!(
            decide(true, Some(down("hq")), no_lookup),
            bypass(Some("hq"), BypassReason::PeerDown)
        );
        assert_eq!(
            decide(true, Some(rejecting(down("hq"))), no_lookup),
            Decision::Reject { peer: "hq".into() }
        );
    }

    #[test]
    fn only_the_first_secondary_is_tried() {
        // The secondary's own secondary is not followed.
        let peer = with_secondary(down("hq"), "dr");
        let lookup = |name: &str| match name {
            "dr" => Some(with_secondary(down("dr"), "third")),
            _ => panic!("looked up {name}"),
        };
        assert_eq!(
            decide(true, Some(peer), lookup),
            bypass(Some("hq"), BypassReason::PeerDown)
        );
    }
}

//! Typed addresses, so a client address is never passed where a destination is expected.

use std::fmt;
use std::net::SocketAddr;

/// The TCP client's address, as the gateway that accepted the connection saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr);

/// The address the client connected to. With TPROXY the accepted socket's local address is
/// the original destination: the kernel never rewrote the packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OrigDstAddr(pub SocketAddr);

impl fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for OrigDstAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `addr` with an IPv4-mapped IPv6 address turned back into IPv4, so that a dual-stack
/// socket's view of an IPv4 peer compares equal to the IPv4 address.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_become_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.1.2.3]:80"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            canonical(mapped),
            "10.1.2.3:80".parse().unwrap_or_else(|e| panic!("{e}"))
        );
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(canonical(v6), v6);
    }
}

//! Every socket option the proxy sets, in one place.
//!
//! - Interception: listeners with `IP_TRANSPARENT` / `IPV6_TRANSPARENT`, so that TPROXY can
//!   hand them connections addressed to other hosts. The accepted socket's local address is
//!   the original destination.
//! - Re-origination: an outgoing socket bound, again with the transparent option, to the
//!   client's own address (`IP_BIND_ADDRESS_NO_PORT` lets `connect` pick the port, so the
//!   4-tuple, not the local pair, has to be unique), so that the server sees the real client.
//! - LAN tuning: TCP keepalive, `TCP_NODELAY`, and `SO_LINGER` 0 to turn a close into a reset.

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use wsx_tunnel::Target;

/// Connections a listener queues before accepting.
const BACKLOG: i32 = 4096;

/// A listener that accepts connections for any address (the target of a TPROXY rule).
/// An IPv6 listener is IPv6-only; IPv4 needs its own.
pub fn transparent_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    set_transparent(&socket, addr.ip())?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// Connects to `to`, from `from` if given (a foreign address: the socket is made transparent),
/// giving up after `timeout`.
pub async fn connect(
    from: Option<IpAddr>,
    to: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(from) = from {
        set_transparent(&socket, from)?;
        // The option lives at the IP level for both families.
        set_int(&socket, libc::SOL_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)?;
        socket.bind(&SocketAddr::new(from, 0).into())?;
    }
    socket.set_nonblocking(true)?;
    let socket = TcpSocket::from_std_stream(socket.into());
    match tokio::time::timeout(timeout, socket.connect(to)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// Connects to `to`, resolving a name first and trying its addresses in turn, all within
/// `timeout`; from `from` (transparently) when given.
pub async fn connect_target(
    from: Option<IpAddr>,
    to: &Target,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let (host, port) = match to {
        Target::Addr(a) => return connect(from, *a, timeout).await,
        Target::Name { host, port } => (host.as_str(), *port),
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let resolved = tokio::time::timeout_at(deadline, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "name resolution timed out"))??;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
    for addr in resolved {
        // A transparent bind needs the client's family.
        if from.is_some_and(|f| f.is_ipv4() != addr.is_ipv4()) {
            continue;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        match connect(from, addr, left).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Settings for the sockets on the LAN side.
#[derive(Debug, Clone, Copy)]
pub struct LanSocketOptions {
    /// Idle time before the first keepalive probe; `None` leaves keepalive off.
    pub keepalive: Option<Duration>,
}

/// Applies `options` to an accepted or connected LAN socket.
pub fn tune(stream: &TcpStream, options: &LanSocketOptions) -> io::Result<()> {
    let socket = SockRef::from(stream);
    // Data from the tunnel arrives in bursts; sending it at once is what the client wants.
    socket.set_nodelay(true)?;
    if let Some(time) = options.keepalive {
        let interval = (time / 4).max(Duration::from_secs(1));
        let keepalive = TcpKeepalive::new()
            .with_time(time)
            .with_interval(interval)
            .with_retries(4);
        socket.set_tcp_keepalive(&keepalive)?;
    }
    Ok(())
}

/// Marks what `stream` sends with `dscp` (the upper six bits of the IPv4 TOS byte or the
/// IPv6 traffic class; ECN bits left to the kernel). A dual-stack socket's IPv4 traffic
/// follows `IP_TOS`, so an IPv6 socket sets both.
pub fn set_dscp(stream: &TcpStream, dscp: u8) -> io::Result<()> {
    let socket = SockRef::from(stream);
    let tos = u32::from(dscp & 0x3f) << 2;
    match stream.local_addr()? {
        SocketAddr::V4(_) => socket.set_tos(tos),
        SocketAddr::V6(_) => {
            set_int(
                &socket,
                libc::IPPROTO_IPV6,
                libc::IPV6_TCLASS,
                tos as libc::c_int,
            )?;
            // Harmless where the socket carries only IPv6; needed for mapped IPv4.
            let _ = socket.set_tos(tos);
            Ok(())
        }
    }
}

/// Caps what the kernel buffers for `stream` on the receiving side at about `bytes` (the
/// kernel doubles the value for its bookkeeping; autotuning stops): a shaped session's
/// sender is held back by TCP flow control instead of filling the gateway's memory.
pub fn set_receive_buffer(stream: &TcpStream, bytes: usize) -> io::Result<()> {
    SockRef::from(stream).set_recv_buffer_size(bytes)
}

/// Closes `stream` with a reset (RST) instead of a FIN: the peer must not mistake an
/// abandoned connection for a complete one.
pub fn abort(stream: TcpStream) {
    // Without the linger option the close would be orderly; a failure leaves just that.
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

fn set_transparent(socket: &Socket, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(_) => socket.set_ip_transparent(true),
        IpAddr::V6(_) => set_int(socket, libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1),
    }
}

fn set_int(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the fd is a valid open socket for the duration of the call, and the option
    // value is a c_int whose size is passed along.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_resolved_and_its_addresses_tried_in_turn() {
        // "localhost" may resolve to ::1 first; only 127.0.0.1 listens.
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let target = Target::Name {
            host: "localhost".into(),
            port,
        };
        let stream = connect_target(None, &target, Duration::from_secs(5)).await;
        assert!(stream.is_ok(), "{stream:?}");
        let nowhere = Target::Name {
            host: "no-such-host.invalid".into(),
            port,
        };
        assert!(
            connect_target(None, &nowhere, Duration::from_secs(5))
                .await
                .is_err()
        );
    }
}

//! Every socket option the proxy sets, in one place.
//!
//! - Interception: listeners with `IP_TRANSPARENT` / `IPV6_TRANSPARENT`, so that TPROXY can
//!   hand them connections addressed to other hosts. The accepted socket's local address is
//!   the original destination.
//! - Re-origination: an outgoing socket bound, again with the transparent option, to the
//!   client's own address, so that the server sees the real client. Which port:
//!   - the far gateway, connecting for a stream its peer opened, keeps the client's own
//!     port, so the server sees the 4-tuple the client chose. A port this host picked could
//!     be one the client already uses to the same server by another way (a session the
//!     near gateway relays directly, or one the kernel routes past a paused gateway), and
//!     that connection's replies would then be delivered here. `SO_REUSEADDR` lets two
//!     sessions share a client port toward different servers; when the 4-tuple is in use
//!     here anyway, `connect` falls back to a port of the kernel's choosing.
//!   - the near gateway, relaying an intercepted connection directly, lets the kernel pick
//!     (`IP_BIND_ADDRESS_NO_PORT`): the client's own 4-tuple is the connection it
//!     intercepted, and one conntrack entry for both legs would turn the second leg's
//!     packets INVALID to a stateful firewall.
//!
//!   Each port bound explicitly is one the kernel skips when it picks a port itself, so a
//!   gateway carrying many sessions should have an `ip_local_port_range` apart from its
//!   clients' (see the deployment guide).
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
    note_arrivals(SockRef::from(&socket), addr);
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// Connects to `to`, from `from` if given (a foreign address: the socket is made transparent),
/// giving up after `timeout`. A `from` with a port keeps it unless this host already has
/// that 4-tuple; with port 0 the kernel picks one. See the module documentation.
pub async fn connect(
    from: Option<SocketAddr>,
    to: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + timeout;
    let attempt = |from| async move {
        match tokio::time::timeout_at(deadline, connect_socket(from, to)?).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
    };
    match from {
        Some(f) if f.port() != 0 => match attempt(Some(f)).await {
            Err(e) if port_taken(&e) => attempt(Some(SocketAddr::new(f.ip(), 0))).await,
            result => result,
        },
        _ => attempt(from).await,
    }
}

/// A socket bound to `from` (see [`connect`]), and the connect to `to` to await.
fn connect_socket(
    from: Option<SocketAddr>,
    to: SocketAddr,
) -> io::Result<impl Future<Output = io::Result<TcpStream>>> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(from) = from {
        set_transparent(&socket, from.ip())?;
        if from.port() == 0 {
            // The option lives at the IP level for both families.
            set_int(&socket, libc::SOL_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)?;
        }
        // Shared with sessions bound to the same client port toward other servers.
        socket.set_reuse_address(true)?;
        socket.bind(&from.into())?;
    }
    socket.set_nonblocking(true)?;
    Ok(TcpSocket::from_std_stream(socket.into()).connect(to))
}

/// The error of a bind or connect whose local port (or whole 4-tuple) is in use here.
fn port_taken(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
    )
}

/// Connects to `to`, resolving a name first and trying its addresses in turn, all within
/// `timeout`; from `from` (transparently) when given.
pub async fn connect_target(
    from: Option<SocketAddr>,
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

/// Asks the kernel to remember, for every connection `listener` accepts, the TOS byte (or
/// traffic class) and the interface of the packets that opened it, for [`arrival`]. An
/// IPv6 listener also asks at the IPv4 level, for the IPv4 clients of a dual-stack socket.
pub fn record_arrival(listener: SockRef<'_>, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int(&listener, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        set_int(&listener, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
        if listener.only_v6().unwrap_or(true) {
            return Ok(());
        }
    }
    set_int(&listener, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
    set_int(&listener, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)
}

/// [`record_arrival`] for a listener on `addr`, where failing costs only the filters on
/// DSCP and interface their matches (said once, at debug level).
pub fn note_arrivals(listener: SockRef<'_>, addr: SocketAddr) {
    if let Err(e) = record_arrival(listener, addr.is_ipv6()) {
        tracing::debug!(%addr, error = %e, "the listener cannot record how connections arrive");
    }
}

/// How a connection arrived: the DSCP of the client's packets and the index of the
/// interface they came in on, as the kernel kept them from the handshake (see
/// [`record_arrival`]; `IP_PKTOPTIONS` / `IPV6_2292PKTOPTIONS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arrival {
    pub dscp: Option<u8>,
    pub interface: Option<u32>,
}

/// Reads how `stream` arrived. `client` picks the level: an IPv4 client's (also on an IPv6
/// socket, mapped) is kept at the IPv4 level.
pub fn arrival(stream: &TcpStream, client: SocketAddr) -> io::Result<Arrival> {
    let ipv4 = match client {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let (level, name) = if ipv4 {
        (libc::IPPROTO_IP, libc::IP_PKTOPTIONS)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_2292PKTOPTIONS)
    };
    // Aligned for `cmsghdr`; room for the two messages with plenty to spare.
    let mut control = [0u64; 32];
    let mut len = size_of_val(&control) as libc::socklen_t;
    // SAFETY: the fd is a valid socket for the call; `control` is writable for `len` bytes
    // and `len` is updated to what the kernel wrote.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            level,
            name,
            control.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a zeroed msghdr is valid; only its control fields are used, and they describe
    // `len` bytes of `control`, which the kernel filled with whole control messages.
    let mut arrival = Arrival::default();
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = len as _;
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) | (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    let tos = data.cast::<libc::c_int>().read_unaligned();
                    arrival.dscp = Some(((tos >> 2) & 0x3f) as u8);
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let info = data.cast::<libc::in_pktinfo>().read_unaligned();
                    arrival.interface = u32::try_from(info.ipi_ifindex).ok().filter(|&i| i > 0);
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let info = data.cast::<libc::in6_pktinfo>().read_unaligned();
                    arrival.interface = Some(info.ipi6_ifindex).filter(|&i| i > 0);
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    Ok(arrival)
}

/// The name of interface `index`, if it still exists.
pub fn interface_name(index: u32) -> Option<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes the call may write, NUL included.
    let found = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    if found.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Accepts one waiting connection on `listener`, if there is one, and closes it with a reset
/// at once. Returns whether it did.
pub fn refuse_waiting(listener: &TcpListener) -> bool {
    // SAFETY: the listener's fd is valid for the call; null address arguments are allowed.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    let socket = unsafe { <Socket as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // Linger 0: the close is a reset. Without it the close would be orderly, which the
    // client would also notice at once; either way it does not wait.
    let _ = socket.set_linger(Some(Duration::ZERO));
    drop(socket);
    true
}

/// The default memory budget: a quarter of the host's memory (`MemTotal`), at least 64 MiB;
/// 1 GiB when the host's memory cannot be read.
pub fn default_memory_budget() -> u64 {
    const FLOOR: u64 = 64 << 20;
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| mem_total(&info));
    total.map_or(1 << 30, |bytes| (bytes / 4).max(FLOOR))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft limit on open descriptors now in force.
pub fn descriptor_limit() -> io::Result<u64> {
    Ok(open_file_limit()?.rlim_cur)
}

/// Raises the soft limit on open descriptors to the hard one (systemd's `LimitNOFILE` sets
/// both; a shell's soft limit is often 1,024). Returns the limit now in force, and the one
/// before.
pub fn raise_descriptor_limit() -> io::Result<(u64, u64)> {
    let mut limit = open_file_limit()?;
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit; raising the soft limit up to the hard one is
        // always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((limit.rlim_cur, before))
}

fn open_file_limit() -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
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

    #[test]
    fn mem_total_is_read_from_meminfo() {
        let info = "MemTotal:       24615424 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(info), Some(24_615_424 * 1024));
        assert_eq!(mem_total("MemFree: 12 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
    }

    /// A client that marks its packets, on each family and on a dual-stack listener.
    #[tokio::test]
    async fn a_connection_tells_its_dscp_and_interface() {
        let cases = [
            ("127.0.0.1:0", "127.0.0.1", 46u8),
            ("[::1]:0", "::1", 10),
            ("[::]:0", "127.0.0.1", 34),
        ];
        for (listen, connect_to, dscp) in cases {
            let Ok(listener) = TcpListener::bind(listen).await else {
                eprintln!("skipped {listen}: no such address here");
                continue;
            };
            let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
            note_arrivals(SockRef::from(&listener), addr);
            let to = SocketAddr::new(
                connect_to.parse().unwrap_or_else(|e| panic!("{e}")),
                addr.port(),
            );
            let client = Socket::new(Domain::for_address(to), Type::STREAM, None)
                .unwrap_or_else(|e| panic!("{e}"));
            let tos = u32::from(dscp) << 2;
            match to {
                SocketAddr::V4(_) => client.set_tos(tos),
                SocketAddr::V6(_) => {
                    set_int(&client, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos as i32)
                }
            }
            .unwrap_or_else(|e| panic!("{e}"));
            client.connect(&to.into()).unwrap_or_else(|e| panic!("{e}"));
            let (accepted, from) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
            let arrival = arrival(&accepted, from).unwrap_or_else(|e| panic!("{listen}: {e}"));
            assert_eq!(arrival.dscp, Some(dscp), "{listen} from {from}");
            let lo = arrival.interface.and_then(interface_name);
            assert_eq!(lo.as_deref(), Some("lo"), "{listen} from {from}");
        }
    }

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

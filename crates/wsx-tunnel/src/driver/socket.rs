//! The UDP socket: creation, buffer sizes, how the driver waits on it, and batched sends
//! and receives through quinn-udp (GSO: one `sendmsg` per pacing burst; GRO and `recvmmsg`:
//! many datagrams per `recvmsg`).

use quinn_udp::{RecvMeta, UdpSocketState};
use rustix::event::epoll;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Kernel buffer asked for in each direction. A 1 Gbit/s tunnel receives 1.25 MB every
/// 10 ms; the buffer absorbs the time the driver task is busy elsewhere (or descheduled)
/// without the kernel dropping datagrams that already crossed the WAN.
pub const SOCKET_BUFFER: usize = 8 << 20;

/// Largest datagram accepted from a peer: peers send at most the `max_datagram` we declare,
/// which is at most [`crate::config::MAX_DATAGRAM`].
pub(super) const MAX_RECEIVE_DATAGRAM: usize = crate::config::MAX_DATAGRAM as usize;

/// A bound, non-blocking UDP socket. An unspecified IPv6 address accepts IPv4 as well.
pub(super) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Sets both kernel buffers to `bytes`. Above `net.core.{r,w}mem_max` the kernel silently
/// caps the size unless the process has `CAP_NET_ADMIN` and uses the `*BUFFORCE` options, so
/// those are tried first; a smaller result is logged with the sysctl to raise.
pub(super) fn set_buffers(socket: &UdpSocket, bytes: usize) {
    type Set = fn(&socket2::SockRef<'_>, usize) -> io::Result<()>;
    type Get = fn(&socket2::SockRef<'_>) -> io::Result<usize>;
    let sock = socket2::SockRef::from(socket);
    let buffers: [(libc::c_int, Set, Get, &str); 2] = [
        (
            libc::SO_RCVBUFFORCE,
            |s, n| s.set_recv_buffer_size(n),
            |s| s.recv_buffer_size(),
            "net.core.rmem_max",
        ),
        (
            libc::SO_SNDBUFFORCE,
            |s, n| s.set_send_buffer_size(n),
            |s| s.send_buffer_size(),
            "net.core.wmem_max",
        ),
    ];
    for (force, set, get, name) in buffers {
        let result = set_forced(socket, force, bytes).or_else(|_| set(&sock, bytes));
        // Linux reports twice the size set (it counts its bookkeeping overhead).
        match (result, get(&sock)) {
            (Ok(()), Ok(actual)) if actual / 2 >= bytes => {}
            (_, actual) => tracing::warn!(
                wanted = bytes,
                actual = actual.map(|a| a / 2).unwrap_or(0),
                "UDP socket buffer smaller than wanted; raise {name} (or run with CAP_NET_ADMIN)"
            ),
        }
    }
}

fn set_forced(socket: &UdpSocket, option: libc::c_int, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for the borrow of `socket`, and `value` is a c_int that
    // outlives the call, whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The address as the rest of the crate sees it: IPv4 peers of a dual-stack socket arrive as
/// IPv4-mapped IPv6 addresses and are turned back into IPv4.
pub(super) fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The address to hand to the kernel: an IPv6 socket sends to IPv4 peers through their
/// IPv4-mapped address.
pub(super) fn for_socket(addr: SocketAddr, ipv6_socket: bool) -> SocketAddr {
    match addr {
        SocketAddr::V4(v4) if ipv6_socket => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        other => other,
    }
}

/// The tunnel's socket and the epoll set that watches it for the driver.
///
/// tokio's reactor is edge-triggered, and each datagram that arrives on a socket registered
/// with it wakes a thread parked in it, whether a task waits or not: at 100 Mbit/s that is
/// a wake-up every 120 µs. To take arrivals in batches the driver must stop listening for a
/// while, which a tokio registration cannot do. So the socket sits, level-triggered, in an
/// epoll set of its own, and only that set is registered with tokio; [`Watched::watch`]
/// changes what the set reports (one `epoll_ctl` when it changes). A socket left unwatched
/// wakes nobody; watched again with datagrams waiting, it reports them at once.
#[derive(Debug)]
pub(super) struct Watched {
    socket: UdpSocket,
    epoll: AsyncFd<OwnedFd>,
    /// What the set reports: (arrivals, room to send).
    watching: (bool, bool),
}

impl Watched {
    /// Watches `socket` (non-blocking) for arrivals. Needs a tokio runtime.
    pub(super) fn new(socket: UdpSocket) -> io::Result<Self> {
        let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &set,
            &socket,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        // SAFETY: the `AsyncFd` owns the set's descriptor, which stays open until it is
        // dropped.
        let epoll = unsafe { AsyncFd::register_with_interest(set, Interest::READABLE) }?;
        Ok(Self {
            socket,
            epoll,
            watching: (true, false),
        })
    }

    pub(super) fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Reports arrivals (`read`) and room to send (`write`) from now on, or not. Returns
    /// whether something now watched for is already there, which may not be reported:
    /// the caller receives or sends before it waits.
    ///
    /// (The kernel reports what a change of the set finds ready only when the socket was
    /// not still listed as ready from an earlier report, which nothing here clears: so the
    /// set is asked, without waiting, which also clears a stale listing.)
    pub(super) fn watch(&mut self, read: bool, write: bool) -> io::Result<bool> {
        if self.watching == (read, write) {
            return Ok(false);
        }
        let mut flags = epoll::EventFlags::empty();
        flags.set(epoll::EventFlags::IN, read);
        flags.set(epoll::EventFlags::OUT, write);
        let set = self.epoll.get_ref();
        epoll::modify(set, &self.socket, epoll::EventData::new_u64(0), flags)?;
        self.watching = (read, write);
        if flags.is_empty() {
            return Ok(false);
        }
        let mut events = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }];
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        Ok(epoll::wait(set, &mut events, Some(&now))? > 0)
    }

    /// Completes once the socket has what is watched for, and takes the report: the caller
    /// then receives (or sends) until the socket would block, or comes back without
    /// waiting, since a report is not repeated for what was already there.
    pub(super) async fn ready(&self) -> io::Result<()> {
        let mut guard = self.epoll.readable().await?;
        guard.clear_ready();
        Ok(())
    }
}

/// Receive buffers for one `recvmmsg` call: [`quinn_udp::BATCH_SIZE`] slots, each large
/// enough for a GRO batch.
#[derive(Debug)]
pub(super) struct RecvBuffers {
    data: Box<[u8]>,
    slot: usize,
    pub(super) meta: [RecvMeta; quinn_udp::BATCH_SIZE],
}

impl RecvBuffers {
    pub(super) fn new(state: &UdpSocketState) -> Self {
        // GRO coalesces at most 64 KiB into one buffer, whatever the segment count.
        let slot = (state.gro_segments() * MAX_RECEIVE_DATAGRAM).min(u16::MAX as usize);
        Self {
            data: vec![0; slot * quinn_udp::BATCH_SIZE].into_boxed_slice(),
            slot,
            meta: [RecvMeta::default(); quinn_udp::BATCH_SIZE],
        }
    }

    /// Reads as many datagrams as one call can; returns the number of slots filled, or
    /// `WouldBlock` when nothing is waiting.
    pub(super) fn receive(
        &mut self,
        socket: &UdpSocket,
        state: &UdpSocketState,
    ) -> io::Result<usize> {
        let mut chunks = self.data.chunks_mut(self.slot).map(IoSliceMut::new);
        let mut slices: [IoSliceMut<'_>; quinn_udp::BATCH_SIZE] =
            std::array::from_fn(|_| chunks.next().expect("BATCH_SIZE slots were allocated"));
        state.recv(socket.into(), &mut slices, &mut self.meta)
    }

    /// Slot `i`'s received bytes, as datagrams: `(offset, len)` pairs within
    /// [`RecvBuffers::data_mut`], one per GRO segment.
    pub(super) fn segments(&self, i: usize) -> impl Iterator<Item = (usize, usize)> + use<> {
        let meta = self.meta[i];
        let base = i * self.slot;
        let len = meta.len.min(self.slot);
        let stride = meta.stride.max(1);
        (0..len)
            .step_by(stride)
            .map(move |start| (base + start, stride.min(len - start)))
    }

    pub(super) fn data(&self) -> &[u8] {
        &self.data
    }

    pub(super) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

/// What became of a send.
#[derive(Debug)]
pub(super) enum Outcome {
    Sent,
    /// The socket's buffer is full: nothing was sent; try again once it is writable.
    Blocked,
    /// Tests: sends to this destination are held back as if the buffer were full for it
    /// alone (nothing was sent; the socket itself stays writable).
    #[cfg(test)]
    Held,
    /// The kernel refused the datagrams (no route, message too large, ...). They are lost;
    /// the tunnel's loss recovery treats them like losses on the path.
    Refused(io::Error),
}

impl Outcome {
    /// `Some` when nothing was sent and the transmit must wait, saying whether the wait is
    /// for the socket to become writable (a full buffer) or only for the next round (a
    /// test's held destination, whose socket stays writable).
    pub(super) fn not_sent(&self) -> Option<bool> {
        match self {
            Outcome::Blocked => Some(true),
            #[cfg(test)]
            Outcome::Held => Some(false),
            Outcome::Sent | Outcome::Refused(_) => None,
        }
    }
}

/// Sends `contents` (several datagrams of `segment_size` when given) if the socket takes
/// them now. Never waits: a full buffer is [`Outcome::Blocked`] (watch the socket for room).
/// Datagrams marked with a DSCP (`dscp` above 0) go through [`send_marked`]: quinn-udp sets
/// the TOS byte of every send to its ECN field alone.
pub(super) fn try_send(
    socket: &UdpSocket,
    state: &UdpSocketState,
    destination: SocketAddr,
    contents: &[u8],
    (segment_size, dscp): (Option<usize>, u8),
) -> Outcome {
    let transmit = quinn_udp::Transmit {
        destination,
        ecn: None,
        contents,
        segment_size,
        src_ip: None,
    };
    loop {
        let sent = if dscp == 0 {
            state.try_send(socket.into(), &transmit)
        } else {
            send_marked(socket, &transmit, dscp)
        };
        match sent {
            Ok(()) => return Outcome::Sent,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Outcome::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Outcome::Refused(e),
        }
    }
}

/// One `sendmsg` of `transmit` with its TOS byte (traffic class) set to `dscp` (ECN bits
/// clear), cut into `segment_size` datagrams by the kernel (GSO) when given. Only segment
/// sizes quinn-udp has found the socket supports reach it: the driver sizes its bursts by
/// [`UdpSocketState::max_gso_segments`].
fn send_marked(socket: &UdpSocket, transmit: &quinn_udp::Transmit<'_>, dscp: u8) -> io::Result<()> {
    let destination = socket2::SockAddr::from(transmit.destination);
    let ipv4 = match transmit.destination {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let tos = libc::c_int::from(dscp & 0x3f) << 2;
    let mut iov = libc::iovec {
        iov_base: transmit.contents.as_ptr().cast_mut().cast(),
        iov_len: transmit.contents.len(),
    };
    // Aligned for `cmsghdr`: room for UDP_SEGMENT and IP_TOS (16 + 16 bytes on 64-bit).
    let mut control = [0u64; 8];
    // SAFETY: every pointer in `msg` (address, iovec, control buffer) refers to memory that
    // lives across the `sendmsg` call; the control messages are written within `control`
    // through the CMSG macros over the length computed with CMSG_SPACE, and the kernel only
    // reads the iovec's bytes.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = destination.as_ptr().cast_mut().cast();
        msg.msg_namelen = destination.len();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        let segment = transmit
            .segment_size
            .filter(|&s| s < transmit.contents.len());
        let int_space = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
        let gso_space = libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = int_space + segment.map_or(0, |_| gso_space);
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
        if ipv4 {
            (*cmsg).cmsg_level = libc::IPPROTO_IP;
            (*cmsg).cmsg_type = libc::IP_TOS;
        } else {
            (*cmsg).cmsg_level = libc::IPPROTO_IPV6;
            (*cmsg).cmsg_type = libc::IPV6_TCLASS;
        }
        libc::CMSG_DATA(cmsg)
            .cast::<libc::c_int>()
            .write_unaligned(tos);
        if let Some(segment) = segment {
            let cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            let segment = u16::try_from(segment).unwrap_or(u16::MAX);
            libc::CMSG_DATA(cmsg).cast::<u16>().write_unaligned(segment);
        }
        libc::sendmsg(socket.as_raw_fd(), &raw const msg, 0)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// The TOS byte (traffic class) of the next datagram on `socket`, and its length.
    fn receive_tos(socket: &std::net::UdpSocket) -> (usize, u8) {
        let mut data = [0u8; 2048];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: test code; the buffers outlive the call and the CMSG macros stay within
        // the control length the kernel returned.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &raw mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of_val(&control);
            let n = libc::recvmsg(socket.as_raw_fd(), &raw mut msg, 0);
            assert!(n >= 0, "{}", io::Error::last_os_error());
            let mut tos = None;
            let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            while !cmsg.is_null() {
                let data = libc::CMSG_DATA(cmsg);
                match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                    (libc::IPPROTO_IP, libc::IP_TOS) => tos = Some(data.read()),
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        tos = Some(data.cast::<libc::c_int>().read_unaligned() as u8);
                    }
                    _ => {}
                }
                cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
            }
            (n as usize, tos.expect("the TOS byte was reported"))
        }
    }

    /// Marked bursts leave with their DSCP in every datagram, on each family, cut by GSO
    /// where the socket has it; unmarked ones with none.
    #[test]
    fn a_burst_leaves_with_its_dscp() {
        for local in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(receiver) = std::net::UdpSocket::bind(local) else {
                eprintln!("skipped {local}: no such address here");
                continue;
            };
            let to = receiver.local_addr().unwrap_or_else(|e| panic!("{e}"));
            let (level, option) = if to.is_ipv4() {
                (libc::IPPROTO_IP, libc::IP_RECVTOS)
            } else {
                (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS)
            };
            let one: libc::c_int = 1;
            // SAFETY: a valid socket and a c_int option value of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    receiver.as_raw_fd(),
                    level,
                    option,
                    (&raw const one).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            let sender = bind(local.parse().unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
            let state = UdpSocketState::new((&sender).into()).unwrap_or_else(|e| panic!("{e}"));
            let segments = state.max_gso_segments().min(3);
            let contents = vec![5u8; 1200 * segments];
            for dscp in [46u8, 0] {
                let segment = (segments > 1).then_some(1200);
                let outcome = try_send(&sender, &state, to, &contents, (segment, dscp));
                assert!(matches!(outcome, Outcome::Sent), "{local}: {outcome:?}");
                for _ in 0..segments {
                    assert_eq!(receive_tos(&receiver), (1200, dscp << 2), "{local}");
                }
            }
        }
    }

    /// Whether `watched` reports within a while. What is watched for is reported within
    /// milliseconds; the negative cases can only be observed as nothing in a bounded wait.
    async fn reports(watched: &Watched) -> bool {
        let wait = std::time::Duration::from_millis(200);
        tokio::time::timeout(wait, watched.ready()).await.is_ok()
    }

    /// Arrivals wake the driver only while it watches for them, and datagrams that came
    /// while it did not are reported as soon as it watches again; a report taken is not
    /// repeated for datagrams still waiting.
    #[tokio::test]
    async fn arrivals_are_reported_only_while_watched() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let socket = bind(addr).unwrap_or_else(|e| panic!("{e}"));
        let to = socket.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut watched = Watched::new(socket).unwrap_or_else(|e| panic!("{e}"));
        let peer = std::net::UdpSocket::bind(addr).unwrap_or_else(|e| panic!("{e}"));
        let send = || {
            peer.send_to(b"datagram", to)
                .unwrap_or_else(|e| panic!("{e}"));
        };
        assert!(!reports(&watched).await, "nothing arrived yet");
        send();
        assert!(reports(&watched).await, "an arrival is reported");
        assert!(!reports(&watched).await, "the report was taken");
        let watch = |watched: &mut Watched, read, write| {
            watched.watch(read, write).unwrap_or_else(|e| panic!("{e}"))
        };
        assert!(
            !watch(&mut watched, false, false),
            "nothing to say unwatched"
        );
        send();
        assert!(!reports(&watched).await, "not watched: no report");
        assert!(
            watch(&mut watched, true, false),
            "two waiting, said once watched"
        );
        let mut buf = [0u8; 64];
        for _ in 0..2 {
            let (n, _) = watched
                .socket()
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&buf[..n], b"datagram");
        }
        let empty = watched.socket().recv_from(&mut buf);
        assert!(empty.is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock));
        assert!(!watch(&mut watched, false, false));
        assert!(!watch(&mut watched, true, false), "nothing waits now");
        send();
        assert!(
            reports(&watched).await,
            "an arrival while watched is reported"
        );
        let _ = watched.socket().recv_from(&mut buf);
        // Room to send (a UDP socket has room at once) is said when asked for.
        assert!(watch(&mut watched, false, true), "room to send");
    }

    #[test]
    fn mapped_addresses_round_trip() {
        let v4 = SocketAddr::from((Ipv4Addr::new(10, 71, 2, 2), 4500));
        let mapped = for_socket(v4, true);
        assert!(mapped.is_ipv6());
        assert_eq!(canonical(mapped), v4);
        assert_eq!(for_socket(v4, false), v4);
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 4500));
        assert_eq!(for_socket(v6, true), v6);
        assert_eq!(canonical(v6), v6);
    }
}

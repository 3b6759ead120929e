//! Every raw syscall the lab makes, in one place: packet sockets, batched send and receive,
//! precise waiting, namespaces and resource usage. Everything else in the crate is safe code.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// Nanoseconds on `CLOCK_MONOTONIC`. The clock is shared by all network namespaces of the host,
/// so timestamps taken by the lab's endpoint processes can be compared with each other.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` in nanoseconds: the clock of the kernel's receive timestamps
/// ([`recv_stamped`]).
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn set_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its size is passed.
    check(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    })?;
    Ok(())
}

/// Prepares a test endpoint's datagram socket to measure the path and not its own
/// scheduling: the kernel stamps each datagram with its arrival time (read with
/// [`recv_stamped`]), and the receive buffer is set to `buffer_bytes` (which the kernel
/// doubles for its bookkeeping) past `rmem_max`, so that a reader held off the CPU for a
/// while loses nothing. Needs `CAP_NET_ADMIN` (the lab runs as root).
pub fn stamp_arrivals(sock: &impl AsRawFd, buffer_bytes: usize) -> io::Result<()> {
    set_int(sock, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
    let size = buffer_bytes.min(i32::MAX as usize) as libc::c_int;
    set_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size)
}

/// Receives one datagram into `buf` (blocking, within the socket's read timeout): its length
/// and, on a socket prepared by [`stamp_arrivals`], when the kernel received it
/// (`CLOCK_REALTIME` ns, compare with [`realtime_ns`]). A datagram longer than `buf` is cut
/// to it, as by `recv`; a socket with more control messages than the timestamp on (the
/// buffer holds 64 bytes of them) is an error rather than an arrival without its time.
pub fn recv_stamped(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    loop {
        // SAFETY: `msg` points at `iov` (which points at `buf`) and at `control`, all of which
        // outlive the call, with their lengths.
        let got = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
        if got >= 0 {
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(io::Error::other("control messages cut short"));
            }
            return Ok((got as usize, received_at(&msg)));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Moves the calling thread into the network namespace at `path` (`/run/netns/NAME`).
/// Only this thread changes namespace; sockets it creates afterwards live in that namespace.
pub(crate) fn enter_netns(path: &Path) -> io::Result<()> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the descriptor is open for the duration of the call.
    check(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Asks the kernel to kill this process when the thread that spawned it exits, so that an
/// emulator or endpoint never outlives the lab that started it. Call from `pre_exec`.
pub(crate) fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) })?;
    Ok(())
}

/// Lowers the timer slack of the calling thread to 1 ns so that waits end on time.
pub(crate) fn precise_timers() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes an integer and no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) })?;
    Ok(())
}

/// Raises the soft limit on open descriptors to the hard one, for programs that hold many
/// connections; a failure leaves the limit as it was.
pub(crate) fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the calls to fill and read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
}

/// CPU time and peak memory of a process, all threads included.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub sys_s: f64,
    /// Peak resident set size in KiB.
    pub max_rss_kb: u64,
}

/// Resource usage of the calling process.
pub fn process_usage() -> Usage {
    usage(libc::RUSAGE_SELF)
}

/// Resource usage of another running process, from `/proc/<pid>/stat` (user and system
/// clock ticks) and `/proc/<pid>/status` (`VmHWM`).
pub fn usage_of(pid: u32) -> std::io::Result<Usage> {
    let invalid = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}: {what}"),
        )
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces:
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| invalid("stat"))
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let max_rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| invalid("status has no VmHWM"))?;
    Ok(Usage {
        user_s: ticks(11)? as f64 / hz,
        sys_s: ticks(12)? as f64 / hz,
        max_rss_kb,
    })
}

/// Resource usage of the calling thread (the peak RSS is still the process's).
pub(crate) fn thread_usage() -> Usage {
    usage(libc::RUSAGE_THREAD)
}

fn usage(who: libc::c_int) -> Usage {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Usage {
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
        max_rss_kb: ru.ru_maxrss as u64,
    }
}

/// An `AF_PACKET` raw socket bound to one interface: it sees every frame the interface
/// receives (not those it sends) and transmits whole Ethernet frames.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    pub(crate) fn bind(ifname: &str, buffer_bytes: usize) -> io::Result<Self> {
        let name = CString::new(ifname).map_err(|_| io::Error::other("interface name has NUL"))?;
        // SAFETY: `name` is a valid C string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {ifname}"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2) call.
        let raw = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                proto as libc::c_int,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor that we own.
        let sock = Self {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        };
        set_int(&sock, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        // Each frame's own arrival time, not the time its batch was read; root may exceed
        // rmem_max/wmem_max, and large buffers absorb bursts while we sleep.
        stamp_arrivals(&sock, buffer_bytes)?;
        let size = buffer_bytes.min(i32::MAX as usize) as libc::c_int;
        set_int(&sock, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, size)?;
        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: `addr` is a valid sockaddr_ll of the length we pass.
        check(unsafe {
            libc::bind(
                raw,
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        Ok(sock)
    }

    /// Frames the kernel dropped because this socket's receive buffer was full, since the last
    /// call (the kernel resets the counter when read).
    pub(crate) fn take_kernel_drops(&self) -> io::Result<u64> {
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `stats` is writable and `len` holds its size.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut stats as *mut libc::tpacket_stats as *mut libc::c_void,
                &mut len,
            )
        })?;
        Ok(u64::from(stats.tp_drops))
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Reusable `mmsghdr`/`iovec` arrays for `recvmmsg` and `sendmmsg`, so that batched I/O
/// allocates nothing per call.
pub(crate) struct MsgBatch {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
    /// One control buffer per header, for the receive timestamp (aligned for `cmsghdr`).
    controls: Vec<[u64; 8]>,
}

// SAFETY: the raw pointers inside are only scratch space refilled before every syscall.
unsafe impl Send for MsgBatch {}

impl std::fmt::Debug for MsgBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgBatch")
            .field("capacity", &self.headers.len())
            .finish()
    }
}

impl MsgBatch {
    pub(crate) fn new(capacity: usize) -> Self {
        // SAFETY: mmsghdr and iovec are plain data; null pointers are valid "empty" values.
        let header: libc::mmsghdr = unsafe { std::mem::zeroed() };
        let iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Self {
            headers: vec![header; capacity],
            iovecs: vec![iov; capacity],
            controls: vec![[0; 8]; capacity],
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.headers.len()
    }

    fn prepare(&mut self, bufs: &mut dyn Iterator<Item = (*mut u8, usize)>) -> usize {
        let mut n = 0;
        for (ptr, len) in bufs.take(self.headers.len()) {
            self.iovecs[n] = libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            };
            // SAFETY: mmsghdr is plain data.
            self.headers[n] = unsafe { std::mem::zeroed() };
            self.headers[n].msg_hdr.msg_iov = &mut self.iovecs[n];
            self.headers[n].msg_hdr.msg_iovlen = 1;
            n += 1;
        }
        n
    }

    /// Receives up to one frame into each buffer without blocking. Returns, per filled buffer in
    /// order, the frame length, whether it was truncated and, if the socket asked for them
    /// (`SO_TIMESTAMPNS`), when the kernel received it (`CLOCK_REALTIME` ns). `Ok(0)` when
    /// nothing is waiting.
    ///
    /// # Safety
    /// Every `(ptr, len)` must point to `len` writable bytes that stay valid during the call.
    pub(crate) unsafe fn recv(
        &mut self,
        sock: &PacketSocket,
        bufs: &mut dyn Iterator<Item = (*mut u8, usize)>,
        out: &mut Vec<(usize, bool, Option<u64>)>,
    ) -> io::Result<usize> {
        out.clear();
        let n = self.prepare(bufs);
        for (header, control) in self.headers[..n].iter_mut().zip(&mut self.controls) {
            header.msg_hdr.msg_control = control.as_mut_ptr().cast();
            header.msg_hdr.msg_controllen = size_of_val(control);
        }
        // SAFETY: headers[..n] point at iovecs[..n], which point at caller-guaranteed buffers.
        let got = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.headers.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(err),
            };
        }
        for header in &self.headers[..got as usize] {
            let truncated = header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            out.push((
                header.msg_len as usize,
                truncated,
                received_at(&header.msg_hdr),
            ));
        }
        Ok(got as usize)
    }

    /// Sends one frame per buffer. Returns how many the kernel took; a frame it refuses
    /// (buffer full) ends the batch early.
    ///
    /// # Safety
    /// Every `(ptr, len)` must point to `len` readable bytes that stay valid during the call.
    pub(crate) unsafe fn send(
        &mut self,
        sock: &PacketSocket,
        bufs: &mut dyn Iterator<Item = (*mut u8, usize)>,
    ) -> io::Result<usize> {
        let n = self.prepare(bufs);
        let mut sent = 0;
        while sent < n {
            // SAFETY: headers[sent..n] point at caller-guaranteed buffers.
            let got = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    self.headers[sent..].as_mut_ptr(),
                    (n - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if got < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => Ok(sent),
                    _ if err.raw_os_error() == Some(libc::ENOBUFS) => Ok(sent),
                    _ => Err(err),
                };
            }
            sent += got as usize;
        }
        Ok(sent)
    }
}

/// The `SCM_TIMESTAMPNS` control message of a received `msg`, in ns, if it has one.
fn received_at(msg: &libc::msghdr) -> Option<u64> {
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer with whole
    // control messages; the CMSG macros stay within them and the timespec is read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts = libc::CMSG_DATA(cmsg)
                    .cast::<libc::timespec>()
                    .read_unaligned();
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

/// An eventfd used to wake the emulator's loop from its control thread.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain eventfd(2) call.
        let raw = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `raw` is a fresh descriptor that we own.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter only means a wake is pending.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when nothing is pending is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout_ns` passes (`None`: forever), with
/// nanosecond resolution. Marks each readable descriptor in `ready`.
pub(crate) fn wait_readable(
    fds: &[RawFd],
    timeout_ns: Option<u64>,
    ready: &mut [bool],
) -> io::Result<()> {
    let mut pollfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    assert!(
        fds.len() <= pollfds.len(),
        "wait_readable takes at most four descriptors"
    );
    for (pfd, &fd) in pollfds.iter_mut().zip(fds) {
        *pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: pollfds[..len] are initialised; `ts_ptr` is null or points at a live timespec.
    let ret = unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            ts_ptr,
            std::ptr::null(),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    for (flag, pfd) in ready.iter_mut().zip(&pollfds[..fds.len()]) {
        *flag = pfd.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    }
    Ok(())
}

/// Sets the TCP congestion control algorithm of a socket (`TCP_CONGESTION`), then reads back
/// the algorithm the kernel actually uses.
pub fn set_tcp_congestion(fd: RawFd, algorithm: &str) -> io::Result<String> {
    // SAFETY: the pointer and length describe `algorithm`'s bytes.
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            algorithm.as_ptr().cast(),
            algorithm.len() as u32,
        )
    })?;
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` is writable and `len` holds its size.
    check(unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_usage_agrees_with_getrusage_for_this_process() {
        // Other tests' threads run meanwhile: /proc is read between two getrusage calls.
        let before = process_usage();
        let seen = usage_of(std::process::id()).expect("our own /proc entry");
        let after = process_usage();
        assert!(seen.max_rss_kb > 0 && seen.max_rss_kb <= after.max_rss_kb + 1024);
        // /proc counts in clock ticks (10 ms): allow one tick per field.
        let (a, b, c) = (
            before.user_s + before.sys_s,
            seen.user_s + seen.sys_s,
            after.user_s + after.sys_s,
        );
        assert!(
            b <= c + 0.02 && b + 0.1 >= a,
            "getrusage {a} s before and {c} s after, /proc {b} s"
        );
    }
}

//! Paced UDP: a constant offered load, for measuring the emulator itself (rate accuracy, loss
//! statistics, cost) without a congestion controller in the way.

use crate::sys::monotonic_ns;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

/// Sends datagrams that make IP packets of `ip_bytes` from `socket` to `to`, at `rate_mbit` of
/// IP bytes, for `seconds`; returns how many it sent.
///
/// Each packet has its own due time on a fixed schedule, so the long-run rate is exact however
/// late a single send is. The sender sleeps when it is more than a millisecond ahead and never
/// spins, so it leaves the CPU to the processes being measured; packets may leave in bursts of
/// up to a millisecond's worth.
pub fn send_paced(
    socket: &UdpSocket,
    to: SocketAddr,
    ip_bytes: usize,
    rate_mbit: f64,
    seconds: f64,
) -> io::Result<u64> {
    let headers = if to.is_ipv4() { 20 + 8 } else { 40 + 8 };
    let payload = vec![0x5a; ip_bytes.saturating_sub(headers)];
    let interval_ns = ip_bytes as f64 * 8.0 / (rate_mbit * 1e6) * 1e9;
    let total = (seconds * 1e9 / interval_ns) as u64;
    let start = monotonic_ns();
    for i in 0..total {
        let due = start + (i as f64 * interval_ns) as u64;
        let now = monotonic_ns();
        if due > now + 1_000_000 {
            std::thread::sleep(Duration::from_nanos(due - now - 500_000));
        }
        socket.send_to(&payload, to)?;
    }
    Ok(total)
}

//! The wsx lab: everything wsx is measured on.
//!
//! - [`Lab`] builds the topology `client — gw-a — wan — gw-b — server` out of network
//!   namespaces and veth pairs (IPv4 and IPv6, routed through both gateways), with unique names
//!   per run, and removes it when dropped. [`clean`] removes what killed runs left behind.
//! - [`emulator`] is the userspace WAN emulator (the kernel here has no `netem`): a one-process
//!   `AF_PACKET` bridge in the `wan` namespace that applies, per direction, delay, jitter, random
//!   and Gilbert-Elliott loss, a bottleneck rate with a drop-tail queue, reordering and
//!   duplication, changeable at run time, and counts every packet it forwards or drops.
//! - [`traffic`] sends deterministic streams over parallel TCP connections and verifies every
//!   byte at the sink, with goodput, time to first byte and per-flow rates in 100 ms buckets.
//! - [`samba`]: a Samba server from a private configuration in a namespace, for the SMB
//!   tests and benchmarks.
//! - [`WanSpec`] describes a WAN in the usual terms (RTT, loss, rate) for the CLI and the
//!   benchmark harness.
//!
//! The `wsx-lab` binary is the CLI over all of this, and also the program the lab runs inside
//! its namespaces (the emulator and the traffic endpoints), so the library needs to find it:
//! see [`lab_binary`].

pub mod emulator;
pub mod netns;
pub mod samba;
mod sys;
mod topology;
pub mod traffic;
mod wan;

pub use sys::{
    Usage, monotonic_ns, process_usage, realtime_ns, recv_stamped, set_tcp_congestion,
    stamp_arrivals, usage_of,
};
pub use topology::{Lab, Node, PREFIX, active, addr, clean, install_signal_cleanup};
pub use wan::{LossDirection, WanSpec};

use anyhow::{Result, bail};
use std::path::PathBuf;
use std::sync::OnceLock;

static LAB_BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Makes the lab run this `wsx-lab` binary (the emulator, and endpoints started by callers
/// that ask [`lab_binary`]) for the rest of the process, e.g. a release build for benchmarks.
/// Only the first call takes effect.
pub fn use_lab_binary(path: PathBuf) {
    let _ = LAB_BINARY.set(path);
}

/// The `wsx-lab` binary that the lab runs inside its namespaces: the one given to
/// [`use_lab_binary`], else `$WSX_LAB_BIN`, else the running program if it is `wsx-lab`, else
/// `wsx-lab` beside the running program or one directory up (where Cargo puts binaries relative
/// to test executables in `deps/`).
pub fn lab_binary() -> Result<PathBuf> {
    if let Some(path) = LAB_BINARY.get() {
        return Ok(path.clone());
    }
    if let Some(path) = std::env::var_os("WSX_LAB_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    if exe.file_name().is_some_and(|n| n == "wsx-lab") {
        return Ok(exe);
    }
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("wsx-lab");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "cannot find the wsx-lab binary near {}: build it (`cargo build -p wsx-lab`) or set WSX_LAB_BIN",
        exe.display()
    )
}

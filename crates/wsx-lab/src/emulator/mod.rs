//! The userspace WAN emulator (this kernel has no `netem`).
//!
//! - [`params`]: what a direction of the link does (delay, jitter, loss, burst loss, rate, queue,
//!   reordering, duplication);
//! - [`model`]: the pure per-direction link model that decides each packet's fate;
//! - [`bridge`]: the process that moves frames between the two wan-side interfaces through the
//!   model, with batched `AF_PACKET` I/O;
//! - [`control`]: the control socket for statistics and run-time changes.

pub mod bridge;
pub mod control;
pub mod model;
pub mod params;
pub mod stats;

pub use control::{Direction, EmulatorConfig, EmulatorHandle};
pub use params::{GilbertElliott, LinkParams, QueueLimit};
pub use stats::{DirectionStats, EmulatorStats, LATE_NS};

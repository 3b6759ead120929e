//! Precision bandwidth control for wsx: the scenario tree and the scheduler that holds every
//! flow relayed by a gateway to it.
//!
//! # Architecture
//!
//! ```text
//!  [shaper] wan_rate + [[scenario]]s ─> Tree::build (checked: depth, minimums, modes)
//!                                          │
//!  session start ─> its leaf scenario ─> Shaper::open(scenario, port) ─> FlowId
//!  flow has data ─> Shaper::push                    │
//!  port can send ─> Shaper::next(now, port) ─> Grant { flow, max_bytes } ─> send ─> Shaper::sent
//!  nothing may send yet ─> Shaper::poll_timeout(now, port) ─> wake up then
//! ```
//!
//! - [`rate`]: [`Rate`] as operators write it, and the exact earliest-departure-time clock
//!   behind every minimum, maximum and per-flow rate (lateness carried forward up to
//!   [`CATCH_UP`], no credit for idling).
//! - [`tree`]: [`ScenarioSpec`] and [`Tree::build`], which refuses what could never be
//!   honoured and names the scenario and field.
//! - [`classify`]: [`FilterSpec`]s and named [`AddressList`]s compiled into a
//!   [`Classifier`]: the first matching filter names a session's scenario, at a cost that
//!   does not grow with the number of filters.
//! - [`shaper`]: [`Shaper`], the two-phase scheduler (minimums by earliest deadline, then the
//!   excess by priority and equal shares, then the flows of a leaf by deficit round robin).
//!   Its module documentation states the model.
//!
//! The crate is a pure state machine: time is an argument (`clippy.toml` bans reading the
//! clock), there is no I/O and no allocation per turn. The gateway (`wsx-proxy`) drives it
//! from the tunnel's stream scheduler and from a timer for the direct relays.
//!
//! Only what a gateway relays is shaped: TCP sessions it terminates. UDP and ICMP pass
//! through the gateway's kernel untouched.

pub mod classify;
pub mod rate;
pub mod shaper;
pub mod tree;

pub use classify::{
    AddressList, Arrival, Classifier, FilterError, FilterField, FilterSpec, Match, PortRange,
    SessionKey,
};
pub use rate::{CATCH_UP, Rate, RateError, WAKE_GAP};
pub use shaper::{FlowId, GRANT, Grant, PortId, PortKind, ScenarioStats, Shaper};
pub use tree::{
    Field, LeafError, MAX_DEPTH, MAX_SCENARIOS, Mode, PRIORITIES, ScenarioId, ScenarioSpec, Tree,
    TreeError,
};

//! The wsx tunnel: one long-lived, authenticated and encrypted UDP tunnel between two gateways
//! that carries many TCP connections as streams.
//!
//! This crate will hold:
//! - a **sans-IO core** in the style of quinn-proto: an `Endpoint` that demultiplexes datagrams
//!   and runs handshakes, and a `Connection` driven by `handle_datagram(now, ..)`,
//!   `handle_timeout(now)`, `poll_transmit(now, buf)`, `poll_timeout()` and `poll_event()`, with
//!   streams (opened with metadata: original addresses, scenario, application hint), flow control,
//!   half-close and reset, and small reliable control messages between peers;
//! - reliability with SACK ranges and coalesced, rate-limited NAKs, so the reverse path carries at
//!   most one packet per twenty data packets at steady state;
//! - congestion control behind a `Controller` trait, with the default high-speed adaptive
//!   controller (Rapid Start, then Optimal Congestion Control) that reacts to the *pattern* of
//!   losses rather than to every loss, and a pacer;
//! - a thin tokio + quinn-udp driver with GSO/GRO and a precise pacing timer.
//!
//! The wire format will be specified in `PROTOCOL.md` beside this crate. Nothing is implemented
//! yet; see the project's issue tracker.

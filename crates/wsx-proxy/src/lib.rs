//! The gateway side of wsx.
//!
//! This crate will hold the TPROXY listener and the original-destination lookup (typed client and
//! original-destination addresses, all socket-option syscalls in one module), the relays between
//! TCP sockets and tunnel streams with bounded buffers and half-close propagation, transparent
//! re-origination at the far gateway, peer selection by destination prefix, and bypass when the
//! peer is unreachable. Nothing is implemented yet; see the project's issue tracker.

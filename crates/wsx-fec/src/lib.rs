//! Forward error correction for the wsx tunnel.
//!
//! This crate will hold a systematic Reed-Solomon codec over groups of data packets of unequal
//! length (padded, true lengths carried), the group state a sender and a receiver keep, and the
//! redundancy policy: a pure function from observed loss statistics to the number of parity
//! packets, sending none on a clean path. It performs no I/O and never reads the clock. Nothing is
//! implemented yet; see the project's issue tracker.

//! Simulation tests: the whole protocol between two endpoints over simulated links, in virtual
//! time. They assert counts and invariants, never wall-clock time.

mod fec;
mod mtu;
mod security;
mod simulation;

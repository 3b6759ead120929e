//! SMB2/3 for wsx: the wire format, the observer that tells which connections the
//! read-ahead engine may touch, and the engine.
//!
//! # Architecture
//!
//! ```text
//!  TCP 445 bytes, each direction ─> Deframer (Direct TCP: first KEEP bytes of each frame)
//!      ─> Protocol (SMB2, SMB1, encrypted, compressed) ─> Messages (compound chain)
//!      ─> Header + the bodies that decide ─> Observer: Negotiating / Unsigned / PassThrough(why)
//! ```
//!
//! - [`wire`]: everything on the wire, in smoltcp's style (a parsed representation with
//!   `parse`/`emit`, never a panic on input): [`wire::framing`] (Direct TCP),
//!   [`wire::header`] (the 64-byte header, its flags and commands, compound chains),
//!   [`wire::messages`] (NEGOTIATE, SESSION_SETUP and TREE_CONNECT responses, READ,
//!   QUERY_INFO and CLOSE requests, READ responses).
//! - [`engine`]: the read-ahead engine's two halves, [`engine::Far`] (the server's
//!   gateway: with a CREATE's answer, issues the QUERY_INFOs and first READ the client
//!   sent after its last CREATE; predicts the next READs of a file read in sequence; all
//!   with the client's own MessageIds, the answers shipped ahead) and [`engine::Near`] (the
//!   client's: answers a request that matches a prediction, and a CLOSE where that is
//!   safe; an answer about a file other clients may write only within the validity window
//!   far gave it), the records between them ([`engine::link`]), and [`engine::Splice`],
//!   which runs a half between a session's two byte streams.
//! - `sim` (tests, or the `sim` feature): a simulated client and a strict server, for
//!   engine tests here and in the gateway.
//! - [`observe`]: [`Observer`], one per connection, fed the bytes the relay copies: its
//!   verdict, and its READs ([`ReadStats`]: how many waited a whole round trip alone).
//!
//! The crate is pure: no I/O, no clock (near is told the time, [`engine::Near::set_now`]).
//! The gateway (`wsx-proxy`) feeds the observer and,
//! when both gateways run the engine, relays each SMB session through a [`engine::Splice`]
//! on each side.

pub mod engine;
pub mod observe;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod wire;

pub use observe::{Direction, KEEP, Observer, ReadStats, Reason, Verdict};

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
//!   [`wire::messages`] (NEGOTIATE, SESSION_SETUP and TREE_CONNECT responses, READ requests
//!   and responses).
//! - [`engine`]: the read-ahead engine's two halves, [`engine::Far`] (the server's
//!   gateway: predicts the client's next READs with the client's own MessageIds and ships
//!   their answers ahead) and [`engine::Near`] (the client's: answers a READ that matches a
//!   prediction), the records between them ([`engine::link`]), and [`engine::Splice`],
//!   which runs a half between a session's two byte streams.
//! - [`observe`]: [`Observer`], one per connection, fed the bytes the relay copies: its
//!   verdict, and its READs ([`ReadStats`]: how many waited a whole round trip alone).
//!
//! The crate is pure: no I/O, no clock. The gateway (`wsx-proxy`) feeds the observer and,
//! when both gateways run the engine, relays each SMB session through a [`engine::Splice`]
//! on each side. CREATE-triggered metadata is the next step.

pub mod engine;
pub mod observe;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod wire;

pub use observe::{Direction, KEEP, Observer, ReadStats, Reason, Verdict};

//! SMB2/3 for wsx: the wire format and the observer that tells which connections the
//! read-ahead engine may touch.
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
//! - [`observe`]: [`Observer`], one per connection, fed the bytes the relay copies: its
//!   verdict, and its READs ([`ReadStats`]: how many waited a whole round trip alone).
//!
//! The crate is pure: no I/O, no clock. The gateway (`wsx-proxy`) feeds it. The read-ahead
//! engine (CREATE-triggered metadata, sequential READ windows) builds on these two layers and
//! is not written yet: today every SMB connection is relayed byte for byte, with TCP-level
//! acceleration, and the observer's verdicts are counted.

pub mod engine;
pub mod observe;
pub mod wire;

pub use observe::{Direction, KEEP, Observer, ReadStats, Reason, Verdict};

//! Forward error correction for the wsx tunnel: systematic Reed-Solomon over blocks of sealed
//! packets, and the policy that decides how much parity a path needs. (The gateways' stream
//! compression is a crate of its own, `wsx-compress`.)
//!
//! Pure code: no I/O, no clock. The tunnel feeds it packets as it sends and receives them.
//!
//! - A **block** is a run of consecutive packet numbers, cut into `depth` interleaved
//!   **groups**: packet `first + i` belongs to group `i % depth`, so a burst of `depth` losses
//!   costs each group one. Each group of at most `k` packets gets up to `m` parity shards.
//!   See [`Block`].
//! - A **shard** is a packet as the caller protects it (the tunnel: a sealed packet without
//!   the header bytes the receiver can rebuild) behind a two-byte length and padded with
//!   zeros to the block's fixed shard size, so packets of unequal length code together and
//!   come back with their true length. Groups closed early (a flush timer,
//!   a trickle of data) count their missing members as zero shards, which neither side
//!   sends.
//! - [`Encoder`] (sender): packets are added as they leave; when the block is full or flushed,
//!   the parity shards wait in an outbox for the pacer.
//! - [`Decoder`] (receiver): keeps copies of protected packets for a while, collects parity,
//!   and rebuilds the missing packets of any group that has `k` shards.
//! - [`policy`]: the loss meter and the pure function from the observed loss rate and burst
//!   length to the block shape, sending no parity on a clean path.
//!
//! The codec is `reed-solomon-simd` (Leopard-style, O(n log n)); `benches/codec.rs` compares
//! it with `reed-solomon-erasure` at the tunnel's shard sizes (BENCHMARKS.md). Decoding
//! evaluates the erasure locator directly for the tunnel's short codes ([`codec`]).

mod block;
pub mod codec;
mod decoder;
mod encoder;
pub mod policy;

pub use block::{Block, PARITY_INFO_LEN, ParityInfo, ParityInfoError, Shape};
pub use decoder::{Decoder, DecoderStats};
pub use encoder::{Encoder, EncoderStats};

/// Bytes before the packet in a shard: its length, big-endian.
pub const LEN_PREFIX: usize = 2;

/// The most packets one block covers (`k · depth`); the decoder keeps this many and more.
pub const MAX_BLOCK: usize = 512;

/// The largest group (`k`): the most the one-byte field of the parity description holds.
pub const MAX_K: u8 = u8::MAX;

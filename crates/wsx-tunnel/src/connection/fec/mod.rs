//! Forward error correction in a connection (PROTOCOL.md §5.1).
//!
//! Sender: while the policy asks for parity, every packet sent joins the open block (and is
//! built small enough to fit a shard); a full block, or one open longer than the flush
//! interval, is coded and its parity queued for the pacer. A protected packet is not declared
//! lost before its block's parity has left and the receiver has had the time (or three later
//! packets) to use it.
//!
//! Receiver: protected packets are kept until their block is settled; parity rebuilds what is
//! missing, and the rebuilt packets are processed as if they had arrived. Their numbers go back
//! in RECOVERED frames, so that the sender counts them as losses (FEC must never hide a loss
//! pattern from congestion control) while not sending them again.
//!
//! The two halves share nothing but the shard layout: [`FecSender`] (`send.rs`) belongs to
//! loss recovery, [`FecReceiver`] (`recv.rs`) to the receive path.

mod recv;
mod send;

pub(super) use recv::FecReceiver;
pub(super) use send::{FecSender, Repair};

use crate::wire::header::{DATA_HEADER_LEN, PARITY_HEADER_LEN};
use wsx_fec::PARITY_INFO_LEN;

/// Bytes of a sealed data packet that its shard leaves out: the receiver id and the packet
/// number (bytes 1..13), which the receiver knows (its own id; the number from the block).
/// A shard carries the type byte, then the ciphertext and tag; so a protected packet can be
/// this much longer than the shard holds.
const REBUILT: usize = DATA_HEADER_LEN - 1;

/// Calls `f` with the part of sealed data packet `packet` that its shard carries, made
/// contiguous in place (the type byte copied over the last byte of the packet number), and
/// puts the packet back as it was.
fn with_shard<R>(packet: &mut [u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let saved = packet[REBUILT];
    packet[REBUILT] = packet[0];
    let result = f(&packet[REBUILT..]);
    packet[REBUILT] = saved;
    result
}

/// FEC counters of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FecStats {
    /// Blocks coded and packets sent in them.
    pub blocks: u64,
    pub packets_protected: u64,
    /// Parity packets and bytes sent: the overhead.
    pub parity_sent: u64,
    pub parity_bytes_sent: u64,
    /// Packets the peer reported rebuilt from our parity: retransmissions avoided.
    pub recovered_by_peer: u64,
    /// Parity packets received, packets rebuilt from them, and groups that lost more than
    /// their parity could rebuild.
    pub parity_received: u64,
    pub recovered: u64,
    pub unrecoverable_groups: u64,
    /// Bytes held here for rebuilding the peer's losses: copies of its protected packets and
    /// its parity (about 2.8 MB once its FEC is in use).
    pub decoder_bytes: u64,
}

impl FecStats {
    /// The two halves' counters together.
    pub(super) fn merge(sent: FecStats, received: FecStats) -> Self {
        FecStats {
            parity_received: received.parity_received,
            recovered: received.recovered,
            unrecoverable_groups: received.unrecoverable_groups,
            decoder_bytes: received.decoder_bytes,
            ..sent
        }
    }
}

/// The shard size for datagrams of at most `max_datagram` bytes: a parity packet is exactly
/// `max_datagram`, its header, the description, the shard. The sender codes each block for
/// the datagram size of the moment (path MTU discovery moves it); the receiver reads a
/// block's shard size from the length of its parity.
fn shard_bytes(max_datagram: usize) -> usize {
    (max_datagram - PARITY_HEADER_LEN - PARITY_INFO_LEN) & !1
}

//! The sender's side: parity for the packets of the open block.

use crate::LEN_PREFIX;
use crate::block::{Block, PARITY_INFO_LEN, ParityInfo, Shape};
use reed_solomon_simd::ReedSolomonEncoder;
use std::collections::VecDeque;

/// Builds the parity of one block at a time. Packets join the open block as they are sent;
/// [`Encoder::close`] codes it and queues the parity shards for [`Encoder::pop_parity`].
///
/// The shard size may change between blocks ([`Encoder::set_shard_bytes`]: the path's
/// datagram size moved); each queued shard keeps the size of its block, which the receiver
/// reads from the parity's length.
#[derive(Debug)]
pub struct Encoder {
    shard_bytes: usize,
    /// One codec per group of the open block, reused from block to block.
    codecs: Codecs,
    open: Option<Block>,
    shard: Vec<u8>,
    zero: Vec<u8>,
    outbox: VecDeque<(ParityInfo, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
    stats: EncoderStats,
}

/// Counters of an [`Encoder`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EncoderStats {
    /// Blocks coded.
    pub blocks: u64,
    /// Groups coded (the groups of the blocks that had members and were given parity).
    pub groups: u64,
    /// Packets protected.
    pub packets: u64,
    /// Parity shards produced.
    pub parity: u64,
}

impl Encoder {
    /// An encoder for shards of `shard_bytes` (even, at least 4): a packet may be at most
    /// `shard_bytes - 2` long.
    pub fn new(shard_bytes: usize) -> Self {
        assert_shard_bytes(shard_bytes);
        Self {
            shard_bytes,
            codecs: Codecs(Vec::new()),
            open: None,
            shard: vec![0; shard_bytes],
            zero: vec![0; shard_bytes],
            outbox: VecDeque::new(),
            spare: Vec::new(),
            stats: EncoderStats::default(),
        }
    }

    /// The longest packet a block can carry.
    pub fn max_packet(&self) -> usize {
        self.shard_bytes - LEN_PREFIX
    }

    /// The bytes the next [`Encoder::pop_parity`] writes: the description and the shard
    /// (of the size of its block; the current size when nothing is queued).
    pub fn parity_len(&self) -> usize {
        PARITY_INFO_LEN
            + self
                .outbox
                .front()
                .map_or(self.shard_bytes, |(_, s)| s.len())
    }

    /// Codes the blocks opened from now on with shards of `shard_bytes` (even, at least 4).
    /// Panics if a block is open: close it first.
    pub fn set_shard_bytes(&mut self, shard_bytes: usize) {
        assert_shard_bytes(shard_bytes);
        assert!(self.open.is_none(), "a block is open");
        self.shard_bytes = shard_bytes;
        self.shard.resize(shard_bytes, 0);
        self.zero.resize(shard_bytes, 0);
    }

    /// The open block, if any.
    pub fn open_block(&self) -> Option<&Block> {
        self.open.as_ref()
    }

    pub fn stats(&self) -> EncoderStats {
        self.stats
    }

    /// Opens a block whose first packet will be `first`. Panics if a block is open or the
    /// shape is invalid.
    pub fn open(&mut self, first: u64, shape: Shape) {
        assert!(self.open.is_none(), "a block is already open");
        assert!(shape.is_valid(), "invalid block shape {shape:?}");
        let (k, m) = (usize::from(shape.k), usize::from(shape.m));
        for g in 0..usize::from(shape.depth) {
            let reset = match self.codecs.0.get_mut(g) {
                Some(codec) => codec.reset(k, m, self.shard_bytes),
                None => ReedSolomonEncoder::new(k, m, self.shard_bytes)
                    .map(|codec| self.codecs.0.push(codec)),
            };
            // Valid shapes and even shard sizes are what the codec accepts.
            debug_assert!(reset.is_ok(), "{reset:?}");
        }
        self.open = Some(Block {
            first,
            count: 0,
            shape,
        });
    }

    /// Adds the next packet of the open block (its number must be `first + count`). Returns
    /// whether the block is now full and should be closed. Packets longer than
    /// [`Encoder::max_packet`] are a caller bug and panic.
    pub fn add(&mut self, pn: u64, packet: &[u8]) -> bool {
        let block = self.open.as_mut().expect("no open block");
        assert_eq!(pn, block.end(), "packets join a block in order");
        assert!(
            packet.len() <= self.shard_bytes - LEN_PREFIX,
            "packet too long"
        );
        let g = (usize::from(block.count)) % usize::from(block.shape.depth);
        block.count += 1;
        let full = usize::from(block.count) == block.shape.packets();
        write_shard(&mut self.shard, packet);
        let added = self.codecs.0[g].add_original_shard(&self.shard);
        debug_assert!(added.is_ok(), "{added:?}");
        self.stats.packets += 1;
        full
    }

    /// Codes the open block and queues its parity: `parity(members)` shards for each group
    /// (at most `m`; missing members count as zero shards; a group given none is not
    /// coded). Returns the block.
    pub fn close(&mut self, mut parity: impl FnMut(usize) -> u8) -> Option<Block> {
        let block = self.open.take()?;
        if block.count == 0 {
            return None;
        }
        self.stats.blocks += 1;
        for g in 0..block.shape.depth {
            let members = block.members(g);
            if members == 0 {
                continue;
            }
            let send = parity(members).min(block.shape.m);
            if send == 0 {
                // Nothing to send: not worth coding (the next `open` resets the codec).
                continue;
            }
            let codec = &mut self.codecs.0[usize::from(g)];
            for _ in members..usize::from(block.shape.k) {
                let added = codec.add_original_shard(&self.zero);
                debug_assert!(added.is_ok(), "{added:?}");
            }
            let Ok(result) = codec.encode() else {
                debug_assert!(false, "encoding a complete group failed");
                continue;
            };
            self.stats.groups += 1;
            for (index, shard) in result.recovery_iter().take(usize::from(send)).enumerate() {
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(shard);
                let info = ParityInfo {
                    block,
                    group: g,
                    index: index as u8,
                };
                self.outbox.push_back((info, buf));
                self.stats.parity += 1;
            }
        }
        Some(block)
    }

    /// Parity shards waiting to be sent.
    pub fn pending_parity(&self) -> usize {
        self.outbox.len()
    }

    /// Writes the next parity shard, its description first, into `out` (at least
    /// [`Encoder::parity_len`] bytes); returns its length.
    pub fn pop_parity(&mut self, out: &mut [u8]) -> Option<usize> {
        let len = self.parity_len();
        if out.len() < len {
            return None;
        }
        let (info, shard) = self.outbox.pop_front()?;
        let (head, body) = out.split_at_mut(PARITY_INFO_LEN);
        info.emit(head.try_into().expect("split at the description's length"));
        body[..shard.len()].copy_from_slice(&shard);
        self.spare.push(shard);
        Some(len)
    }

    /// Drops the open block and the queued parity (the connection is closing).
    pub fn clear(&mut self) {
        self.open = None;
        while let Some((_, buf)) = self.outbox.pop_front() {
            self.spare.push(buf);
        }
    }
}

fn assert_shard_bytes(shard_bytes: usize) {
    assert!(
        shard_bytes >= 4 && shard_bytes % 2 == 0,
        "shard size must be even and at least 4"
    );
}

/// The per-group codecs (which do not implement `Debug`).
struct Codecs(Vec<ReedSolomonEncoder>);

impl std::fmt::Debug for Codecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} codec(s)", self.0.len())
    }
}

/// Writes `packet` as a shard: its length, the bytes, zeros to the end.
pub(crate) fn write_shard(shard: &mut [u8], packet: &[u8]) {
    let len = packet.len() as u16;
    shard[..LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
    shard[LEN_PREFIX..LEN_PREFIX + packet.len()].copy_from_slice(packet);
    shard[LEN_PREFIX + packet.len()..].fill(0);
}

//! The receiver's side: copies of protected packets, parity, and the rebuilding of what
//! was lost.

use crate::block::{Block, ParityInfo};
use crate::encoder::write_shard;
use crate::{LEN_PREFIX, MAX_BLOCK};
use reed_solomon_simd::rate::RateDecoder;
use std::collections::{BTreeMap, VecDeque};

/// Packets kept, by packet number modulo this. A block is given up once the newest packet is
/// [`KEEP`] past its end, by which time none of its members has been overwritten.
const SLOTS: usize = 4 * MAX_BLOCK;
const KEEP: u64 = (SLOTS / 2) as u64;
/// Blocks with parity tracked at once; the oldest go first.
const MAX_BLOCKS: usize = SLOTS;
/// The largest shard taken: a datagram cannot be longer than 65,535 bytes.
const MAX_SHARD: usize = u16::MAX as usize - 1;

/// Rebuilds lost packets from the packets received and the parity of their group.
///
/// Protected packets are handed over twice: [`Decoder::stage`] before they are decrypted (in
/// place), [`Decoder::commit`] once they have authenticated, so that a forged packet never
/// stands in for a real one. Rebuilt packets come out of [`Decoder::pop_recovered`] as they
/// were sent, still sealed: the caller authenticates them like any other.
///
/// Each block has the shard size of its parity (the sender's datagram size when it coded
/// the block, which path MTU discovery may change). Packets are kept in slots as long as
/// the longest protected packet seen so far, which grow (keeping what they hold) when a
/// longer one arrives.
#[derive(Debug)]
pub struct Decoder {
    /// The bytes of each slot: the longest protected packet so far, with its length prefix.
    slot_bytes: usize,
    /// `SLOTS` slots, allocated when the first protected packet arrives.
    shards: Vec<u8>,
    /// Per slot: the packet number it holds, and whether that packet authenticated.
    slot_pn: Vec<u64>,
    slot_ok: Vec<bool>,
    highest: Option<u64>,
    blocks: BTreeMap<u64, BlockState>,
    codec: Codec,
    zero: Vec<u8>,
    recovered: VecDeque<(u64, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
    stats: DecoderStats,
}

#[derive(Debug)]
struct BlockState {
    block: Block,
    /// The length of its parity shards (all of them).
    shard_bytes: usize,
    /// `depth · m` parity shards, group by group.
    parity: Vec<Option<Vec<u8>>>,
    /// Groups with nothing left to do: complete, or rebuilt.
    done: Vec<bool>,
}

/// Counters of a [`Decoder`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecoderStats {
    /// Parity shards accepted.
    pub parity: u64,
    /// Packets rebuilt.
    pub recovered: u64,
    /// Groups that lost more than their parity could rebuild (their losses were left to
    /// retransmission).
    pub unrecoverable: u64,
}

impl Decoder {
    /// A decoder whose slots start at `shard_bytes` (the sender's shard size, if known);
    /// they grow to the longest packet protected.
    pub fn new(shard_bytes: usize) -> Self {
        Self {
            slot_bytes: shard_bytes.clamp(LEN_PREFIX, MAX_SHARD),
            shards: Vec::new(),
            slot_pn: Vec::new(),
            slot_ok: Vec::new(),
            highest: None,
            blocks: BTreeMap::new(),
            codec: Codec(None),
            zero: Vec::new(),
            recovered: VecDeque::new(),
            spare: Vec::new(),
            stats: DecoderStats::default(),
        }
    }

    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Bytes held for packets and parity.
    pub fn memory(&self) -> usize {
        self.shards.len()
            + self
                .blocks
                .values()
                .map(|b| b.parity.iter().flatten().count() * b.shard_bytes)
                .sum::<usize>()
    }

    /// Keeps a copy of protected packet `pn` before it is decrypted. Packets too long to be
    /// protected are ignored.
    pub fn stage(&mut self, pn: u64, packet: &[u8]) {
        if packet.len() + LEN_PREFIX > MAX_SHARD {
            return;
        }
        self.allocate(packet.len() + LEN_PREFIX);
        let slot = slot(pn);
        let at = slot * self.slot_bytes;
        write_shard(&mut self.shards[at..at + self.slot_bytes], packet);
        self.slot_pn[slot] = pn;
        self.slot_ok[slot] = false;
    }

    /// Makes sure the slots exist and hold `bytes` each, moving what they hold into longer
    /// ones when they are too short.
    fn allocate(&mut self, bytes: usize) {
        if self.shards.is_empty() {
            self.slot_bytes = self.slot_bytes.max(bytes);
            self.shards = vec![0; SLOTS * self.slot_bytes];
            self.slot_pn = vec![u64::MAX; SLOTS];
            self.slot_ok = vec![false; SLOTS];
        } else if bytes > self.slot_bytes {
            let mut longer = vec![0; SLOTS * bytes];
            for (old, new) in self
                .shards
                .chunks_exact(self.slot_bytes)
                .zip(longer.chunks_exact_mut(bytes))
            {
                new[..old.len()].copy_from_slice(old);
            }
            self.shards = longer;
            self.slot_bytes = bytes;
        }
        if self.zero.len() < self.slot_bytes {
            self.zero.resize(self.slot_bytes, 0);
        }
    }

    /// Packet `pn`, staged, authenticated: it counts toward its group, which may now be
    /// rebuilt.
    pub fn commit(&mut self, pn: u64) {
        if self.shards.is_empty() {
            return;
        }
        let slot = slot(pn);
        if self.slot_pn[slot] != pn {
            return;
        }
        self.slot_ok[slot] = true;
        if self.highest.is_none_or(|h| pn > h) {
            self.highest = Some(pn);
            self.evict();
        }
        let owner = self
            .blocks
            .range(..=pn)
            .next_back()
            .and_then(|(&first, state)| Some((first, state.block.position(pn)?.0)));
        if let Some((first, group)) = owner {
            self.try_recover(first, group);
        }
    }

    fn has(&self, pn: u64) -> bool {
        held(&self.slot_pn, &self.slot_ok, pn)
    }

    /// Takes a parity shard. Descriptions or sizes that contradict an earlier shard of the
    /// same block, shards of an odd size, and blocks too old or too far ahead are ignored.
    pub fn on_parity(&mut self, info: ParityInfo, shard: &[u8]) {
        if shard.len() < 2 * LEN_PREFIX || shard.len() % 2 != 0 || shard.len() > MAX_SHARD {
            return;
        }
        self.allocate(shard.len());
        let block = info.block;
        if let Some(highest) = self.highest {
            if block.end().saturating_add(KEEP) <= highest
                || block.first > highest.saturating_add(KEEP)
            {
                return;
            }
        }
        let state = self.blocks.entry(block.first).or_insert_with(|| {
            let slots = usize::from(block.shape.depth) * usize::from(block.shape.m);
            BlockState {
                block,
                shard_bytes: shard.len(),
                parity: (0..slots).map(|_| None).collect(),
                done: vec![false; usize::from(block.shape.depth)],
            }
        });
        if state.block != block || state.shard_bytes != shard.len() {
            return;
        }
        let at = usize::from(info.group) * usize::from(block.shape.m) + usize::from(info.index);
        if state.parity[at].is_some() {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(shard);
        state.parity[at] = Some(buf);
        self.stats.parity += 1;
        if self.blocks.len() > MAX_BLOCKS {
            self.evict_first();
        }
        self.try_recover(block.first, info.group);
    }

    /// Rebuilds the missing members of group `g` of block `first` if enough shards are in.
    fn try_recover(&mut self, first: u64, g: u8) {
        let Some(state) = self.blocks.get(&first) else {
            return;
        };
        if state.done[usize::from(g)] {
            return;
        }
        let (block, shard_bytes) = (state.block, state.shard_bytes);
        let (k, m) = (usize::from(block.shape.k), usize::from(block.shape.m));
        let members = block.members(g);
        let missing = (0..members)
            .filter(|&i| !self.has(block.member(g, i)))
            .count();
        if missing == 0 {
            self.mark_done(first, g);
            return;
        }
        let parity = &state.parity[usize::from(g) * m..][..m];
        if parity.iter().flatten().count() < missing {
            return;
        }
        let codec = match &mut self.codec.0 {
            Some(codec) => codec.reset(k, m, shard_bytes).map(|()| codec),
            None => crate::codec::decoder(k, m, shard_bytes, None)
                .map(|codec| self.codec.0.insert(codec)),
        };
        let Ok(codec) = codec else {
            return;
        };
        let mut added = Ok(());
        for i in 0..k {
            // A slot is at least as long as any block's shard (it grows with the parity too);
            // a member longer than the block's shard cannot be one, and fails
            // authentication once rebuilt with anything else.
            let shard = if i >= members {
                &self.zero[..shard_bytes]
            } else {
                let pn = block.member(g, i);
                if !held(&self.slot_pn, &self.slot_ok, pn) {
                    continue;
                }
                let at = slot(pn) * self.slot_bytes;
                &self.shards[at..at + shard_bytes]
            };
            added = added.and(codec.add_original_shard(i, shard));
        }
        for (index, shard) in parity.iter().enumerate() {
            if let Some(shard) = shard {
                added = added.and(codec.add_recovery_shard(index, shard));
            }
        }
        let Ok(()) = added else {
            return;
        };
        // The decoder's result borrows the codec until the end of this block.
        {
            let Ok(result) = codec.decode() else {
                return;
            };
            for (i, shard) in result.restored_original_iter() {
                if i >= members {
                    continue;
                }
                let len = usize::from(u16::from_be_bytes([shard[0], shard[1]]));
                if len > shard_bytes - LEN_PREFIX {
                    // Parity that does not belong with these packets (forged or corrupt); what
                    // it rebuilds would fail authentication anyway.
                    continue;
                }
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(&shard[LEN_PREFIX..LEN_PREFIX + len]);
                self.recovered.push_back((block.member(g, i), buf));
                self.stats.recovered += 1;
            }
        }
        self.mark_done(first, g);
    }

    fn mark_done(&mut self, first: u64, g: u8) {
        if let Some(state) = self.blocks.get_mut(&first) {
            state.done[usize::from(g)] = true;
        }
    }

    /// The next rebuilt packet: its number and length, the bytes at the start of `out`.
    pub fn pop_recovered(&mut self, out: &mut [u8]) -> Option<(u64, usize)> {
        let (pn, packet) = self.recovered.pop_front()?;
        let len = packet.len().min(out.len());
        out[..len].copy_from_slice(&packet[..len]);
        self.spare.push(packet);
        Some((pn, len))
    }

    fn evict(&mut self) {
        let Some(highest) = self.highest else {
            return;
        };
        while self
            .blocks
            .first_key_value()
            .is_some_and(|(_, s)| s.block.end().saturating_add(KEEP) <= highest)
        {
            self.evict_first();
        }
    }

    fn evict_first(&mut self) {
        let Some((_, state)) = self.blocks.pop_first() else {
            return;
        };
        for g in 0..state.block.shape.depth {
            let members = state.block.members(g);
            let incomplete = (0..members).any(|i| !self.has(state.block.member(g, i)));
            if !state.done[usize::from(g)] && members > 0 && incomplete {
                self.stats.unrecoverable += 1;
            }
        }
        self.spare.extend(state.parity.into_iter().flatten());
    }
}

fn slot(pn: u64) -> usize {
    (pn % SLOTS as u64) as usize
}

/// Whether the slots hold packet `pn`, authenticated. A free function, so that it can be
/// asked while the codec is borrowed.
fn held(slot_pn: &[u64], slot_ok: &[bool], pn: u64) -> bool {
    let slot = slot(pn);
    slot_pn.get(slot) == Some(&pn) && slot_ok[slot]
}

/// The codec, made when first needed (it does not implement `Debug`).
struct Codec(Option<crate::codec::Decoder>);

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "codec"
        } else {
            "no codec"
        })
    }
}

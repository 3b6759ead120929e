//! Block shapes and the description each parity shard carries.

use crate::{MAX_BLOCK, MAX_K};

/// How a block is coded: groups of `k` packets, `m` parity shards each, `depth` groups
/// interleaved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub k: u8,
    pub m: u8,
    pub depth: u8,
}

impl Shape {
    /// Packets in a full block.
    pub fn packets(&self) -> usize {
        usize::from(self.k) * usize::from(self.depth)
    }

    /// Whether the shape is one the codec takes: `1 ≤ k ≤ 255`, `1 ≤ m ≤ k`,
    /// `1 ≤ depth`, `k · depth ≤ 512`.
    pub fn is_valid(&self) -> bool {
        (1..=MAX_K).contains(&self.k)
            && (1..=self.k).contains(&self.m)
            && self.depth >= 1
            && self.packets() <= MAX_BLOCK
    }
}

/// A block of packets `first .. first + count`, coded with `shape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub first: u64,
    pub count: u16,
    pub shape: Shape,
}

impl Block {
    /// Packets of group `g` actually sent (the rest of its `k` are zero shards).
    pub fn members(&self, g: u8) -> usize {
        let (count, depth, g) = (
            usize::from(self.count),
            usize::from(self.shape.depth),
            usize::from(g),
        );
        if g >= count {
            0
        } else {
            (count - g).div_ceil(depth)
        }
    }

    /// The packet number of member `i` of group `g`.
    pub fn member(&self, g: u8, i: usize) -> u64 {
        self.first + g as u64 + (i * usize::from(self.shape.depth)) as u64
    }

    /// The group and the index within it of packet `pn`, if the block holds it.
    pub fn position(&self, pn: u64) -> Option<(u8, usize)> {
        let offset = pn.checked_sub(self.first)?;
        if offset >= u64::from(self.count) {
            return None;
        }
        let depth = u64::from(self.shape.depth);
        Some(((offset % depth) as u8, (offset / depth) as usize))
    }

    /// One past the last packet number of the block.
    pub fn end(&self) -> u64 {
        self.first + u64::from(self.count)
    }
}

/// Bytes of a [`ParityInfo`] on the wire.
pub const PARITY_INFO_LEN: usize = 15;

/// What a parity shard belongs to; it travels in front of the shard.
///
/// Wire layout (big-endian): first packet number (u64) · count (u16) · k · m · depth ·
/// group · index (u8 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityInfo {
    pub block: Block,
    /// The group the shard repairs.
    pub group: u8,
    /// The shard's index among the group's parity (`0 .. m`).
    pub index: u8,
}

/// A parity description that is malformed or out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed parity description")]
pub struct ParityInfoError;

impl ParityInfo {
    pub fn emit(&self, out: &mut [u8; PARITY_INFO_LEN]) {
        let b = &self.block;
        out[..8].copy_from_slice(&b.first.to_be_bytes());
        out[8..10].copy_from_slice(&b.count.to_be_bytes());
        out[10] = b.shape.k;
        out[11] = b.shape.m;
        out[12] = b.shape.depth;
        out[13] = self.group;
        out[14] = self.index;
    }

    /// Parses and checks a description: a valid shape, `1 ≤ count ≤ k · depth`, and a group
    /// and index inside it.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParityInfoError> {
        let bytes: &[u8; PARITY_INFO_LEN] = bytes
            .get(..PARITY_INFO_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(ParityInfoError)?;
        let mut first = [0; 8];
        first.copy_from_slice(&bytes[..8]);
        let info = ParityInfo {
            block: Block {
                first: u64::from_be_bytes(first),
                count: u16::from_be_bytes([bytes[8], bytes[9]]),
                shape: Shape {
                    k: bytes[10],
                    m: bytes[11],
                    depth: bytes[12],
                },
            },
            group: bytes[13],
            index: bytes[14],
        };
        let b = &info.block;
        let ok = b.shape.is_valid()
            && b.count >= 1
            && usize::from(b.count) <= b.shape.packets()
            && info.group < b.shape.depth
            && b.members(info.group) > 0
            && info.index < b.shape.m
            && b.first.checked_add(u64::from(b.count)).is_some();
        if ok { Ok(info) } else { Err(ParityInfoError) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(count: u16, k: u8, depth: u8) -> Block {
        Block {
            first: 100,
            count,
            shape: Shape { k, m: 2, depth },
        }
    }

    #[test]
    fn groups_interleave_consecutive_packets() {
        let b = block(10, 4, 3);
        // Groups 0, 1, 2 take 100, 101, 102, then 103, 104, 105, ...
        assert_eq!((b.members(0), b.members(1), b.members(2)), (4, 3, 3));
        assert_eq!(b.member(1, 2), 107);
        assert_eq!(b.position(107), Some((1, 2)));
        assert_eq!(b.position(110), None);
        assert_eq!(b.position(99), None);
        for pn in b.first..b.end() {
            let (g, i) = b.position(pn).unwrap();
            assert_eq!(b.member(g, i), pn);
        }
    }

    #[test]
    fn parity_info_round_trips_and_rejects_nonsense() {
        let info = ParityInfo {
            block: block(7, 4, 2),
            group: 1,
            index: 1,
        };
        let mut wire = [0; PARITY_INFO_LEN];
        info.emit(&mut wire);
        assert_eq!(ParityInfo::parse(&wire), Ok(info));
        assert_eq!(ParityInfo::parse(&wire[..14]), Err(ParityInfoError));
        for (at, value) in [(10, 0), (11, 0), (11, 5), (12, 0), (13, 2), (14, 2)] {
            let mut bad = wire;
            bad[at] = value;
            assert_eq!(ParityInfo::parse(&bad), Err(ParityInfoError), "byte {at}");
        }
        let mut bad = wire;
        (bad[10], bad[12]) = (255, 3);
        assert_eq!(
            ParityInfo::parse(&bad),
            Err(ParityInfoError),
            "k·depth > 512"
        );
        let mut bad = wire;
        bad[8..10].copy_from_slice(&9u16.to_be_bytes());
        assert_eq!(
            ParityInfo::parse(&bad),
            Err(ParityInfoError),
            "count > k·depth"
        );
    }
}

//! Encoder and decoder together: whatever is erased, up to the parity of each group, comes
//! back byte for byte; beyond it nothing false comes back and the group is counted as lost.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::collections::BTreeMap;
use wsx_fec::{Decoder, Encoder, PARITY_INFO_LEN, ParityInfo, Shape};

const SHARD: usize = 1380;

/// Sends `packets` (numbered from `first`) through one block of `shape`, closed after all of
/// them; returns the parity as (description, shard).
fn encode(first: u64, packets: &[Vec<u8>], shape: Shape) -> Vec<(ParityInfo, Vec<u8>)> {
    let mut encoder = Encoder::new(SHARD);
    encoder.open(first, shape);
    for (i, p) in packets.iter().enumerate() {
        let full = encoder.add(first + i as u64, p);
        assert_eq!(full, i + 1 == shape.packets());
    }
    let block = encoder.close(|_| shape.m).unwrap();
    assert_eq!(usize::from(block.count), packets.len());
    let mut out = vec![0; encoder.parity_len()];
    let mut parity = Vec::new();
    while let Some(len) = encoder.pop_parity(&mut out) {
        let info = ParityInfo::parse(&out[..len]).unwrap();
        parity.push((info, out[PARITY_INFO_LEN..len].to_vec()));
    }
    parity
}

fn packets() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 1..=SHARD - 2), 1..=48)
}

fn shapes() -> impl Strategy<Value = Shape> {
    (1u8..=16, 1u8..=4, 1u8..=4).prop_map(|(k, m, depth)| Shape {
        k,
        m: m.min(k),
        depth,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn erasures_within_the_parity_come_back_exactly(
        shape in shapes(),
        packets in packets(),
        erase_seed in any::<u64>(),
        parity_first in any::<bool>(),
    ) {
        let packets: Vec<Vec<u8>> = packets.into_iter().take(shape.packets()).collect();
        let first = 1_000 + erase_seed % 5_000;
        let parity = encode(first, &packets, shape);
        // Erase up to m packets or parity shards of each group.
        let mut rng = fastrand::Rng::with_seed(erase_seed);
        let mut lost_in_group: BTreeMap<u8, u8> = BTreeMap::new();
        let mut erased = Vec::new();
        for (i, _) in packets.iter().enumerate() {
            let g = (i % usize::from(shape.depth)) as u8;
            let lost = lost_in_group.entry(g).or_default();
            if *lost < shape.m && rng.u32(..3) == 0 {
                *lost += 1;
                erased.push(first + i as u64);
            }
        }
        let kept_parity: Vec<_> = parity.iter().filter(|(info, _)| {
            let lost = lost_in_group.entry(info.group).or_default();
            if *lost < shape.m && rng.u32(..4) == 0 {
                *lost += 1;
                false
            } else {
                true
            }
        }).collect();

        let mut decoder = Decoder::new(SHARD);
        let deliver_data = |decoder: &mut Decoder| {
            for (i, p) in packets.iter().enumerate() {
                let pn = first + i as u64;
                if !erased.contains(&pn) {
                    decoder.stage(pn, p);
                    decoder.commit(pn);
                }
            }
        };
        if parity_first {
            for (info, shard) in &kept_parity {
                decoder.on_parity(*info, shard);
            }
            deliver_data(&mut decoder);
        } else {
            deliver_data(&mut decoder);
            for (info, shard) in &kept_parity {
                decoder.on_parity(*info, shard);
            }
        }
        let mut out = vec![0; SHARD];
        let mut rebuilt = Vec::new();
        while let Some((pn, len)) = decoder.pop_recovered(&mut out) {
            let original = &packets[(pn - first) as usize];
            prop_assert_eq!(&out[..len], &original[..], "packet {}", pn);
            rebuilt.push(pn);
        }
        rebuilt.sort_unstable();
        if parity_first {
            // Parity ahead of the data rebuilds packets that were merely late, too.
            prop_assert!(erased.iter().all(|pn| rebuilt.contains(pn)));
        } else {
            prop_assert_eq!(rebuilt, erased);
        }
        prop_assert_eq!(decoder.stats().unrecoverable, 0);
    }
}

#[test]
fn too_many_losses_rebuild_nothing_and_count_the_group() {
    let shape = Shape {
        k: 8,
        m: 2,
        depth: 1,
    };
    let packets: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
    let parity = encode(0, &packets, shape);
    let mut decoder = Decoder::new(SHARD);
    for (i, p) in packets.iter().enumerate().skip(3) {
        decoder.stage(i as u64, p);
        decoder.commit(i as u64);
    }
    for (info, shard) in &parity {
        decoder.on_parity(*info, shard);
    }
    assert_eq!(decoder.pop_recovered(&mut [0; SHARD]), None);
    // Far later packets push the block out of the window.
    for pn in 10_000..10_010u64 {
        decoder.stage(pn, &[1; 10]);
        decoder.commit(pn);
    }
    assert_eq!(decoder.stats().unrecoverable, 1);
}

#[test]
fn a_forged_packet_is_not_used_until_committed() {
    let shape = Shape {
        k: 4,
        m: 1,
        depth: 1,
    };
    let packets: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 200]).collect();
    let parity = encode(0, &packets, shape);
    let mut decoder = Decoder::new(SHARD);
    // Packet 1 is lost; a forgery for packet 2 arrives and fails authentication (no
    // commit); then the real 0, 3 and the parity.
    decoder.stage(2, &[0xee; 200]);
    for pn in [0u64, 3] {
        decoder.stage(pn, &packets[pn as usize]);
        decoder.commit(pn);
    }
    decoder.on_parity(parity[0].0, &parity[0].1);
    assert_eq!(
        decoder.pop_recovered(&mut [0; SHARD]),
        None,
        "two missing, one parity"
    );
    decoder.stage(2, &packets[2]);
    decoder.commit(2);
    let mut out = [0; SHARD];
    assert_eq!(decoder.pop_recovered(&mut out), Some((1, 200)));
    assert_eq!(&out[..200], &packets[1][..]);
}

#[test]
fn a_partial_block_codes_its_missing_members_as_zeros() {
    let shape = Shape {
        k: 16,
        m: 2,
        depth: 2,
    };
    let packets: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 50]).collect();
    let parity = encode(7, &packets, shape);
    assert_eq!(parity.len(), 4, "two groups, two shards each");
    let mut decoder = Decoder::new(SHARD);
    for pn in [7u64, 9, 10] {
        decoder.stage(pn, &packets[(pn - 7) as usize]);
        decoder.commit(pn);
    }
    for (info, shard) in &parity {
        decoder.on_parity(*info, shard);
    }
    let mut out = [0; SHARD];
    let mut got = Vec::new();
    while let Some((pn, len)) = decoder.pop_recovered(&mut out) {
        assert_eq!(&out[..len], &packets[(pn - 7) as usize][..]);
        got.push(pn);
    }
    got.sort_unstable();
    assert_eq!(got, [8, 11]);
}

/// Parity from the network may describe any block: one at the top of the packet-number
/// space is ignored or kept, never a panic.
#[test]
fn parity_for_the_last_packet_numbers_is_harmless() {
    let shape = Shape {
        k: 4,
        m: 1,
        depth: 1,
    };
    let packets: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 20]).collect();
    let (mut info, shard) = encode(0, &packets, shape).remove(0);
    let mut decoder = Decoder::new(SHARD);
    decoder.stage(5, &[1; 20]);
    decoder.commit(5);
    info.block.first = u64::MAX - 4;
    decoder.on_parity(info, &shard);
    let mut fresh = Decoder::new(SHARD);
    fresh.on_parity(info, &shard);
    fresh.stage(u64::MAX - 1, &[1; 20]);
    fresh.commit(u64::MAX - 1);
    for pn in 10..20u64 {
        fresh.stage(pn, &[2; 20]);
        fresh.commit(pn);
    }
}

/// Path MTU discovery changes the shard size between blocks: blocks of different sizes
/// rebuild side by side, a decoder that started small grows its slots without losing the
/// packets it held, and the outbox keeps each shard's own size.
#[test]
fn blocks_of_different_shard_sizes_rebuild_side_by_side() {
    let shape = Shape {
        k: 4,
        m: 1,
        depth: 1,
    };
    let sizes = [1200usize, 9000, 1000];
    let mut encoder = Encoder::new(sizes[0]);
    let mut packets = Vec::new();
    let mut first = 100u64;
    for (b, &shard) in sizes.iter().enumerate() {
        if b > 0 {
            encoder.set_shard_bytes(shard);
        }
        encoder.open(first, shape);
        for i in 0..4 {
            let len = shard - 2 - i * 7;
            let packet: Vec<u8> = (0..len).map(|j| (j * 31 + i + b) as u8).collect();
            encoder.add(first + i as u64, &packet);
            packets.push((first + i as u64, packet));
        }
        encoder.close(|_| 1).unwrap();
        first += 4;
    }
    // The parity waits in the outbox with the size of its block.
    let mut parity = Vec::new();
    let mut out = vec![0; 9000 + PARITY_INFO_LEN];
    for &shard in &sizes {
        assert_eq!(encoder.parity_len(), PARITY_INFO_LEN + shard);
        let len = encoder.pop_parity(&mut out).unwrap();
        let info = ParityInfo::parse(&out[..len]).unwrap();
        parity.push((info, out[PARITY_INFO_LEN..len].to_vec()));
    }
    // Lose the second packet of every block; deliver all data first (the 9000-byte block
    // grows the slots while the first block's packets are held), then the parity.
    let mut decoder = Decoder::new(1000);
    for (pn, packet) in &packets {
        if (pn - 100) % 4 != 1 {
            decoder.stage(*pn, packet);
            decoder.commit(*pn);
        }
    }
    for (info, shard) in &parity {
        decoder.on_parity(*info, shard);
    }
    let mut buf = vec![0; 9000];
    let mut rebuilt = Vec::new();
    while let Some((pn, len)) = decoder.pop_recovered(&mut buf) {
        let original = &packets.iter().find(|(p, _)| *p == pn).unwrap().1;
        assert_eq!(&buf[..len], &original[..], "packet {pn}");
        rebuilt.push(pn);
    }
    assert_eq!(rebuilt, [101, 105, 109]);
    assert_eq!(decoder.stats().unrecoverable, 0);
}

//! Reed-Solomon blocks: encode packets of fuzzer-chosen lengths and contents in a block of a
//! fuzzer-chosen shape, erase up to `m` shards (data or parity) of each group, and check
//! that the decoder rebuilds every erased packet byte for byte and nothing else.
//!
//! The shard size is chosen too: mostly small (16-126 bytes), sometimes the tunnel's own
//! 1380. Nothing in the codec depends on the size beyond the length prefix, and the
//! decoder's window (2,048 shards, zeroed once per decoder) at 1380 bytes would spend most
//! of each execution clearing 2.8 MB.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use wsx_fec::{Decoder, Encoder, PARITY_INFO_LEN, ParityInfo, Shape};

/// The tunnel's shard size: the largest packet it protects plus the length prefix.
const TUNNEL_SHARD: usize = 1380;

/// Reads bytes off the front of the input, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let shard = match input.byte() {
        0..=15 => TUNNEL_SHARD,
        b => 16 + 2 * usize::from(b % 56),
    };
    let k = input.byte() % 32 + 1;
    let m = (input.byte() % 8 + 1).min(k);
    let depth = input.byte() % 4 + 1;
    let shape = Shape { k, m, depth };
    if !shape.is_valid() {
        return;
    }
    let count = usize::from(input.byte()) % shape.packets() + 1;
    let packets: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            let len = (usize::from(input.byte()) * 7 + i) % (shard - 2) + 1;
            let fill = input.byte();
            (0..len).map(|j| fill.wrapping_add(j as u8)).collect()
        })
        .collect();
    let first = u64::from(input.byte()) * 1000;

    let mut encoder = Encoder::new(shard);
    encoder.open(first, shape);
    for (i, p) in packets.iter().enumerate() {
        encoder.add(first + i as u64, p);
    }
    if encoder.open_block().is_some() {
        encoder.close(|_| m);
    }
    let mut out = vec![0; encoder.parity_len()];
    let mut parity = Vec::new();
    while let Some(len) = encoder.pop_parity(&mut out) {
        let info = ParityInfo::parse(&out[..len]).expect("our own parity parses");
        parity.push((info, out[PARITY_INFO_LEN..len].to_vec()));
    }

    // Erase up to m members of each group, data or parity, as the input says.
    let mut lost: BTreeMap<u8, u8> = BTreeMap::new();
    let mut erased = Vec::new();
    for i in 0..count {
        let group = (i % usize::from(depth)) as u8;
        let n = lost.entry(group).or_default();
        if *n < m && input.byte() % 2 == 1 {
            *n += 1;
            erased.push(first + i as u64);
        }
    }
    let mut decoder = Decoder::new(shard);
    for (i, p) in packets.iter().enumerate() {
        let pn = first + i as u64;
        if !erased.contains(&pn) {
            decoder.stage(pn, p);
            decoder.commit(pn);
        }
    }
    for (info, bytes) in &parity {
        let n = lost.entry(info.group).or_default();
        if *n < m && input.byte() % 2 == 1 {
            *n += 1;
            continue;
        }
        decoder.on_parity(*info, bytes);
    }
    let mut buf = vec![0; shard];
    let mut rebuilt = Vec::new();
    while let Some((pn, len)) = decoder.pop_recovered(&mut buf) {
        let original = &packets[(pn - first) as usize];
        assert_eq!(&buf[..len], &original[..], "packet {pn}");
        rebuilt.push(pn);
    }
    rebuilt.sort_unstable();
    assert_eq!(rebuilt, erased);
});

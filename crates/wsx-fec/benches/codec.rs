//! Encode and decode throughput of the two Reed-Solomon crates at the tunnel's shard sizes
//! (1,200-1,450 bytes) and group sizes (k = 16, 32, 64), and of this crate's decoding engine.
//! `cargo bench -p wsx-fec`; figures in BENCHMARKS.md.

#![allow(clippy::unwrap_used)]

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use reed_solomon_erasure::galois_8::ReedSolomon;
use reed_solomon_simd::engine::{DefaultEngine, Engine};
use reed_solomon_simd::rate::{DefaultRateDecoder, RateDecoder};
use std::hint::black_box;

const SHARD: usize = 1382;

fn shards(k: usize, len: usize) -> Vec<Vec<u8>> {
    let mut x = 0x1234_5678_u32;
    (0..k)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (k, m) in [(16, 2), (32, 3), (64, 4), (64, 11), (128, 5), (255, 7)] {
        let data = shards(k, SHARD);
        group.throughput(Throughput::Bytes((k * SHARD) as u64));
        let id = format!("k{k}_m{m}");
        // GF(2^8) codes at most 256 shards in all.
        if k + m <= 256 {
            let rs = ReedSolomon::new(k, m).unwrap();
            let mut parity = vec![vec![0u8; SHARD]; m];
            group.bench_function(BenchmarkId::new("erasure_per_packet", &id), |b| {
                b.iter(|| {
                    for (i, d) in data.iter().enumerate() {
                        rs.encode_single_sep(i, d, &mut parity).unwrap();
                    }
                    black_box(&parity);
                })
            });
        }
        let mut encoder = reed_solomon_simd::ReedSolomonEncoder::new(k, m, SHARD).unwrap();
        group.bench_function(BenchmarkId::new("simd_per_group", &id), |b| {
            b.iter(|| {
                encoder.reset(k, m, SHARD).unwrap();
                for d in &data {
                    encoder.add_original_shard(d).unwrap();
                }
                let result = encoder.encode().unwrap();
                black_box(result.recovery_iter().count());
            })
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    for (k, m, lost) in [
        (32, 3, 1),
        (64, 4, 1),
        (64, 4, 4),
        (64, 11, 8),
        (248, 7, 1),
        (240, 6, 1),
        (255, 7, 1),
        (255, 7, 7),
    ] {
        let data = shards(k, SHARD);
        let mut encoder = reed_solomon_simd::ReedSolomonEncoder::new(k, m, SHARD).unwrap();
        for d in &data {
            encoder.add_original_shard(d).unwrap();
        }
        let parity: Vec<Vec<u8>> = encoder
            .encode()
            .unwrap()
            .recovery_iter()
            .map(<[u8]>::to_vec)
            .collect();
        group.throughput(Throughput::Bytes((lost * SHARD) as u64));
        let id = format!("k{k}_m{m}_lost{lost}");
        if k + m <= 256 {
            let rs = ReedSolomon::new(k, m).unwrap();
            let mut parity = vec![vec![0u8; SHARD]; m];
            for (i, d) in data.iter().enumerate() {
                rs.encode_single_sep(i, d, &mut parity).unwrap();
            }
            group.bench_function(BenchmarkId::new("erasure", &id), |b| {
                b.iter(|| {
                    let mut all: Vec<(Vec<u8>, bool)> = data
                        .iter()
                        .chain(&parity)
                        .enumerate()
                        .map(|(i, s)| (s.clone(), i >= lost))
                        .collect();
                    rs.reconstruct_data(&mut all).unwrap();
                    black_box(&all);
                })
            });
        }
        // reed-solomon-simd's decoder, and the same on the engine the tunnel decodes with
        // (the erasure locator summed directly; wsx_fec::codec).
        let stock = DefaultRateDecoder::new(k, m, SHARD, DefaultEngine::new(), None).unwrap();
        decode_with(&mut group, "simd", &id, stock, (&data, &parity, lost));
        let direct = wsx_fec::codec::decoder(k, m, SHARD, None).unwrap();
        decode_with(
            &mut group,
            "simd_direct_locator",
            &id,
            direct,
            (&data, &parity, lost),
        );
    }
    group.finish();
}

/// Times decoding with `decoder`: the first `lost` originals are rebuilt from the others
/// and as many recovery shards.
fn decode_with<E: Engine, D: RateDecoder<E>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    id: &str,
    mut decoder: D,
    (data, parity, lost): (&[Vec<u8>], &[Vec<u8>], usize),
) {
    let (k, m) = (data.len(), parity.len());
    group.bench_function(BenchmarkId::new(name, id), |b| {
        b.iter(|| {
            decoder.reset(k, m, SHARD).unwrap();
            for (i, d) in data.iter().enumerate().skip(lost) {
                decoder.add_original_shard(i, d).unwrap();
            }
            for (i, p) in parity.iter().enumerate().take(lost) {
                decoder.add_recovery_shard(i, p).unwrap();
            }
            let _ = decoder
                .decode()
                .map(|r| black_box(r.restored_original_iter().count()));
        })
    });
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);

//! Sealing throughput of the AEADs a tunnel packet could use, at the datagram payloads of a
//! 1,500-byte and a 9,000-byte path: the `chacha20poly1305` crate (portable Rust with AVX2),
//! ring's ChaCha20-Poly1305 (what the tunnel uses) and ring's AES-256-GCM (hardware AES and
//! carry-less multiplication). `cargo bench -p wsx-tunnel --bench aead`; figures in
//! BENCHMARKS.md.

#![allow(clippy::unwrap_used)]

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ring::aead::{AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use std::hint::black_box;

/// Sealed bytes of a full datagram: 1,472 and 8,972 bytes less the header and the tag.
const PAYLOADS: [usize; 2] = [1_440, 8_940];
const HEADER: [u8; 16] = [0x5a; 16];

fn nonce(n: u64) -> [u8; 12] {
    let mut nonce = [0; 12];
    nonce[4..].copy_from_slice(&n.to_le_bytes());
    nonce
}

fn seal(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal");
    for len in PAYLOADS {
        let mut payload = vec![0x33u8; len];
        group.throughput(Throughput::Bytes(len as u64));
        let rust = chacha20poly1305::ChaCha20Poly1305::new(&[7u8; 32].into());
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("chacha20poly1305_crate", len), |b| {
            b.iter(|| {
                n += 1;
                let tag = rust
                    .encrypt_in_place_detached(&nonce(n).into(), &HEADER, &mut payload)
                    .unwrap();
                black_box(tag);
            })
        });
        for (name, algorithm) in [
            ("ring_chacha20_poly1305", &CHACHA20_POLY1305),
            ("ring_aes_256_gcm", &AES_256_GCM),
        ] {
            let key = LessSafeKey::new(UnboundKey::new(algorithm, &[7u8; 32]).unwrap());
            group.bench_function(BenchmarkId::new(name, len), |b| {
                b.iter(|| {
                    n += 1;
                    let tag = key
                        .seal_in_place_separate_tag(
                            Nonce::assume_unique_for_key(nonce(n)),
                            Aad::from(&HEADER),
                            &mut payload,
                        )
                        .unwrap();
                    let _ = black_box(tag);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, seal);
criterion_main!(benches);

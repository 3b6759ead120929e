//! Chunked deflate: the two Rust backends (flate2 on zlib-rs, which the crate uses, and
//! miniz_oxide, flate2's default) at levels 1, 2 and 6 on 16 KiB chunks of the lab's text
//! payload, and the crate's whole chunk path (entropy check, deflate or store, back-off) on text and on
//! random data. Ratios (compressed/plain) are printed once per case.
//! `cargo bench -p wsx-compress --bench compress`; figures in BENCHMARKS.md.

#![allow(clippy::unwrap_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flate2::{Compress, Compression, FlushCompress};
use std::hint::black_box;
use std::time::Duration;
use wsx_compress::{Compressor, MAX_CHUNK, decode_all};
use wsx_lab::traffic::{Payload, PayloadKind};

const TOTAL: usize = 1 << 20;

/// `len` bytes of the lab's payload of `kind` (`--payload text` or `random`).
fn payload(kind: PayloadKind, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    Payload::new(kind, 0x5eed, 0).fill(&mut out);
    out
}

fn zlib_rs(engine: &mut Compress, chunk: &[u8], out: &mut [u8]) -> usize {
    engine.reset();
    engine.compress(chunk, out, FlushCompress::Finish).unwrap();
    engine.total_out() as usize
}

fn miniz(level: u8, chunk: &[u8]) -> usize {
    miniz_oxide::deflate::compress_to_vec(chunk, level).len()
}

fn backends(c: &mut Criterion) {
    let data = payload(PayloadKind::Text, TOTAL);
    let mut group = c.benchmark_group("deflate_16k_text");
    group.throughput(Throughput::Bytes(TOTAL as u64));
    let mut out = vec![0u8; MAX_CHUNK * 2];
    for level in [1u8, 2, 6] {
        let mut engine = Compress::new(Compression::new(level.into()), false);
        let wire: usize = data
            .chunks(MAX_CHUNK)
            .map(|c| zlib_rs(&mut engine, c, &mut out))
            .sum();
        eprintln!(
            "zlib-rs level {level}: ratio {:.3}",
            wire as f64 / TOTAL as f64
        );
        group.bench_function(BenchmarkId::new("zlib_rs", level), |b| {
            b.iter(|| {
                for chunk in data.chunks(MAX_CHUNK) {
                    black_box(zlib_rs(&mut engine, chunk, &mut out));
                }
            })
        });
        let wire: usize = data.chunks(MAX_CHUNK).map(|c| miniz(level, c)).sum();
        eprintln!(
            "miniz_oxide level {level}: ratio {:.3}",
            wire as f64 / TOTAL as f64
        );
        group.bench_function(BenchmarkId::new("miniz_oxide", level), |b| {
            b.iter(|| {
                for chunk in data.chunks(MAX_CHUNK) {
                    black_box(miniz(level, chunk));
                }
            })
        });
    }
    // What a larger chunk would buy: one 1 MiB stream at level 2 (the default).
    let mut engine = Compress::new(Compression::new(2), false);
    let mut whole = vec![0u8; TOTAL * 2];
    let wire = zlib_rs(&mut engine, &data, &mut whole);
    eprintln!(
        "zlib-rs level 2, one 1 MiB stream: ratio {:.3}",
        wire as f64 / TOTAL as f64
    );
    group.finish();
}

fn chunk_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("chunks");
    group.throughput(Throughput::Bytes(TOTAL as u64));
    for (name, data) in [
        ("text", payload(PayloadKind::Text, TOTAL)),
        ("random", payload(PayloadKind::Random, TOTAL)),
    ] {
        for level in [1, 6] {
            let mut wire = Vec::with_capacity(TOTAL * 2);
            let mut compressor = Compressor::new(level);
            for chunk in data.chunks(MAX_CHUNK) {
                compressor.encode(chunk, &mut wire);
            }
            eprintln!(
                "{name} level {level}: ratio {:.4}",
                wire.len() as f64 / TOTAL as f64
            );
            group.bench_function(BenchmarkId::new(format!("encode_{name}"), level), |b| {
                // A fresh compressor each pass: random data pays for its first probes.
                b.iter(|| {
                    let mut compressor = Compressor::new(level);
                    wire.clear();
                    for chunk in data.chunks(MAX_CHUNK) {
                        compressor.encode(chunk, &mut wire);
                    }
                    black_box(wire.len());
                })
            });
            group.bench_function(BenchmarkId::new(format!("decode_{name}"), level), |b| {
                b.iter(|| black_box(decode_all(&wire).unwrap().len()))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = backends, chunk_path
}
criterion_main!(benches);

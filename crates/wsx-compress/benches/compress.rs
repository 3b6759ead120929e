//! Chunked deflate: the two Rust backends (flate2 on zlib-rs, which the crate uses, and
//! miniz_oxide, flate2's default) at levels 1, 2 and 6 on 16 KiB chunks of text, and the
//! crate's whole chunk path (entropy check, deflate or store, back-off) on text and on
//! random data. Ratios (compressed/plain) are printed once per case.
//! `cargo bench -p wsx-compress --bench compress`; figures in BENCHMARKS.md.
//!
//! The payloads are generated here, seeded, and are byte for byte what the lab's traffic
//! generator sends for `--payload text` and `--payload random` (flow 0 of a run seeded
//! 0x5eed): the figures compare with the gateway benchmark's, and this crate needs no lab.

#![allow(clippy::unwrap_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flate2::{Compress, Compression, FlushCompress};
use std::hint::black_box;
use std::time::Duration;
use wsx_compress::{Compressor, MAX_CHUNK, decode_all};

const TOTAL: usize = 1 << 20;

/// The lab's generator seed for flow 0 of a run seeded 0x5eed (`wsx_lab::traffic::Payload`
/// mixes the flow number into the run's seed this way).
const SEED: u64 = 0x5eed ^ 0x9e37_79b9_7f4a_7c15;

/// What a payload looks like.
#[derive(Clone, Copy)]
enum PayloadKind {
    /// Pseudo-random bytes: incompressible, like encrypted or already compressed traffic.
    Random,
    /// English-like text from a fixed vocabulary: deflate compresses it about three to one.
    Text,
}

/// `len` bytes of the payload of `kind`.
fn payload(kind: PayloadKind, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut out = Vec::with_capacity(len + 32);
    match kind {
        PayloadKind::Random => {
            while out.len() < len {
                out.extend_from_slice(&rng.u64(..).to_le_bytes());
            }
        }
        PayloadKind::Text => {
            let words: Vec<&str> = VOCABULARY.split_whitespace().collect();
            let mut in_sentence = 0;
            while out.len() < len {
                out.extend_from_slice(words[rng.usize(..words.len())].as_bytes());
                in_sentence += 1;
                // Sentences of six words or more, ending at random.
                if in_sentence >= 6 && rng.u8(..) < 40 {
                    in_sentence = 0;
                    out.extend_from_slice(if rng.bool() { b".\n" } else { b". " });
                } else {
                    out.push(b' ');
                }
            }
        }
    }
    out.truncate(len);
    out
}

/// The text payload's words: common English, networking and business vocabulary (the
/// lab's, in its order: the generator picks them by index).
const VOCABULARY: &str = "\
    the of and to a in is it that for on was with as be at by this from or an are not \
    but which have has were their all one when there can more been other its into than \
    time only some two may then first any over such each after most also made between \
    under network packet server client gateway tunnel stream window latency bandwidth \
    router link queue loss delay frame header payload session protocol address route \
    traffic buffer segment transfer request response connection interface report \
    quarterly revenue customer account invoice shipment warehouse schedule meeting \
    project document contract department manager office budget forecast inventory \
    supplier order delivery payment balance record system process service support update \
    review approval";

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

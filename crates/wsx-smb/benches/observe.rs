//! What watching costs the relay: a recorded SMB 2.1 session (smbclient against Samba)
//! taken through its setup, then a stream of READ responses of 64 KiB and of 1 MiB fed to the
//! observer in 64 KiB reads, as the relay hands them over. Throughput is of the bytes fed.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use wsx_smb::wire::framing::frame_header;
use wsx_smb::{Direction, Observer, Verdict};

/// An observer past a real session's setup and share connect (the capture's requests and
/// responses up to its first READ response's frame, fed in full).
fn established() -> Observer {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/captures/");
    let read = |name: &str| {
        std::fs::read(format!("{dir}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let mut o = Observer::new();
    o.feed(Direction::ToServer, &read("guest21.to_server"));
    o.feed(Direction::ToClient, &read("guest21.to_client"));
    assert_eq!(o.verdict(), Verdict::Unsigned);
    o
}

/// `count` READ responses of `len` data bytes each, framed, headers from a template.
fn read_responses(len: usize, count: usize) -> Vec<u8> {
    let mut message = vec![0u8; 64 + 16];
    message[..4].copy_from_slice(&[0xfe, b'S', b'M', b'B']);
    message[4] = 64;
    message[12] = 0x08; // READ
    message[16] = 0x01; // a response
    message[64] = 17; // StructureSize
    message[66] = 0x50; // DataOffset
    message[68..72].copy_from_slice(&(len as u32).to_le_bytes());
    let mut out = Vec::with_capacity(count * (4 + message.len() + len));
    for i in 0..count {
        message[24..32].copy_from_slice(&(i as u64 + 100).to_le_bytes());
        out.extend_from_slice(
            &frame_header(message.len() + len).unwrap_or_else(|| panic!("frame of {len}")),
        );
        out.extend_from_slice(&message);
        out.resize(out.len() + len, 0x5a);
    }
    out
}

fn observe(c: &mut Criterion) {
    let mut group = c.benchmark_group("observe");
    for (name, len, count) in [("read_64k", 64 << 10, 256), ("read_1m", 1 << 20, 16)] {
        let stream = read_responses(len, count);
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                established,
                |mut o| {
                    for read in stream.chunks(64 << 10) {
                        o.feed(Direction::ToClient, black_box(read));
                    }
                    assert_eq!(o.verdict(), Verdict::Unsigned);
                    o
                },
                criterion::BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, observe);
criterion_main!(benches);

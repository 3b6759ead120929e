//! Chunked stream compression: a byte stream cut into self-contained chunks, each either
//! raw-deflated or stored, so that no compression state lives with the stream.
//!
//! ```text
//! stored   0x00 | len: u16 |                  len bytes as written
//! deflate  0x01 | len: u16 | plain_len: u16 | len bytes of raw deflate (RFC 1951)
//! ```
//!
//! Lengths are big-endian; a chunk holds at most [`MAX_CHUNK`] plain bytes and a deflated
//! chunk is always shorter than its plain text (otherwise it is stored), so a reader never
//! buffers more than `MAX_CHUNK` bytes of a chunk.
//!
//! - **Memory.** A stream's compression state is a [`Compressor`] of two bytes. Every chunk
//!   starts a fresh deflate stream, so the engines (about 270 KiB to deflate and 45 KiB to
//!   inflate with zlib-rs) live once per thread and compression level, not once per stream:
//!   100,000 sessions cost no more than one. The price is the window: a chunk cannot refer to
//!   the one before, which costs text a few percent of ratio at 16 KiB chunks
//!   (BENCHMARKS.md).
//! - **Incompressible data** costs close to nothing: a byte-entropy estimate over a sample of
//!   the chunk (a few microseconds) stores data near 8 bits per byte without trying, and a
//!   chunk that did not shrink by [`MIN_SAVING`] makes the stream skip compression for the
//!   next 1, 2, 4, ... 64 chunks before trying again. Stored chunks cost 3 bytes in 16 KiB.
//! - **Hostile input**: [`Header::parse`] checks the declared lengths before the payload is
//!   read, and [`inflate`] requires a deflated chunk to produce exactly its declared length.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use std::cell::RefCell;

/// The most plain bytes in one chunk.
pub const MAX_CHUNK: usize = 16 * 1024;

/// The longest chunk header.
pub const MAX_HEADER: usize = 5;

/// A deflated chunk must be at least this much smaller than its plain text (1/32, about
/// 3 %) to be sent deflated; below it the chunk is stored and the stream backs off.
pub const MIN_SAVING: usize = 32;

/// Chunks shorter than this are stored: too short for deflate to win back its block header.
const MIN_DEFLATE: usize = 64;

/// Bits per byte above which a sample is taken for incompressible (Huffman coding alone
/// could not save 6 %).
const ENTROPY_LIMIT: f64 = 7.5;

/// The sample for the entropy estimate: up to this many runs of `SAMPLE_RUN` bytes spread
/// over the chunk.
const SAMPLE_RUNS: usize = 8;
const SAMPLE_RUN: usize = 512;

/// The longest back-off: 2^6 = 64 stored chunks (1 MiB) between attempts.
const MAX_BACKOFF: u8 = 6;

const KIND_STORED: u8 = 0;
const KIND_DEFLATE: u8 = 1;

/// How one chunk went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoded {
    /// Deflated to `wire` payload bytes.
    Deflated { plain: usize, wire: usize },
    /// Stored, after compression was tried and did not pay.
    Incompressible { plain: usize },
    /// Stored without trying: compression off, a short chunk, high entropy, or backing off.
    Stored { plain: usize },
}

impl Encoded {
    /// Plain bytes in the chunk.
    pub fn plain(self) -> usize {
        match self {
            Encoded::Deflated { plain, .. }
            | Encoded::Incompressible { plain }
            | Encoded::Stored { plain } => plain,
        }
    }

    /// Whether the chunk went out as it came: its payload is its plain bytes.
    pub fn is_stored(self) -> bool {
        !matches!(self, Encoded::Deflated { .. })
    }

    /// Bytes the chunk took on the stream, header included.
    pub fn wire(self) -> usize {
        match self {
            Encoded::Deflated { wire, .. } => wire + MAX_HEADER,
            Encoded::Incompressible { plain } | Encoded::Stored { plain } => plain + 3,
        }
    }
}

/// The compressing side of one stream: the level and the back-off state.
#[derive(Debug, Clone)]
pub struct Compressor {
    /// 1 (fastest) to 9 (smallest); 0 stores everything.
    level: u8,
    /// Chunks still to store before the next attempt.
    skip: u8,
    /// The current back-off exponent.
    backoff: u8,
}

impl Compressor {
    /// A compressor at `level` (0 to 9; 0 stores everything, values above 9 count as 9).
    pub fn new(level: u32) -> Self {
        Self {
            level: level.min(9) as u8,
            skip: 0,
            backoff: 0,
        }
    }

    /// Appends one chunk carrying `plain` to `out`. `plain` must hold at most
    /// [`MAX_CHUNK`] bytes; callers cut longer writes.
    ///
    /// # Panics
    /// If `plain` is longer than [`MAX_CHUNK`].
    pub fn encode(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Encoded {
        let chunk = self.encode_head(plain, out);
        if chunk.is_stored() {
            out.extend_from_slice(plain);
        }
        chunk
    }

    /// As [`Self::encode`], except that a stored chunk's payload is left to the caller:
    /// only its header is appended, and `plain` itself must follow it on the stream. A
    /// writer that has somewhere to put `plain` directly (a stream's send buffer) saves a
    /// copy of every stored byte.
    ///
    /// # Panics
    /// If `plain` is longer than [`MAX_CHUNK`].
    pub fn encode_head(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Encoded {
        assert!(plain.len() <= MAX_CHUNK, "chunk of {} bytes", plain.len());
        if self.level == 0 || plain.len() < MIN_DEFLATE {
            return store_head(plain, out);
        }
        if self.skip > 0 {
            self.skip -= 1;
            return store_head(plain, out);
        }
        if entropy(plain) > ENTROPY_LIMIT {
            self.back_off();
            return store_head(plain, out);
        }
        let start = out.len();
        out.extend_from_slice(&[KIND_DEFLATE, 0, 0, 0, 0]);
        let limit = plain.len() - plain.len() / MIN_SAVING;
        match deflate(self.level, plain, out, limit) {
            Some(wire) => {
                out[start + 1..start + 3].copy_from_slice(&(wire as u16).to_be_bytes());
                out[start + 3..start + 5].copy_from_slice(&(plain.len() as u16).to_be_bytes());
                self.backoff = 0;
                Encoded::Deflated {
                    plain: plain.len(),
                    wire,
                }
            }
            None => {
                out.truncate(start);
                self.back_off();
                store_head(plain, out);
                Encoded::Incompressible { plain: plain.len() }
            }
        }
    }

    fn back_off(&mut self) {
        self.skip = (1u8 << self.backoff) - 1;
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }
}

/// A stored chunk's header for `plain`; the payload, `plain` as it is, follows it.
fn store_head(plain: &[u8], out: &mut Vec<u8>) -> Encoded {
    out.push(KIND_STORED);
    out.extend_from_slice(&(plain.len() as u16).to_be_bytes());
    Encoded::Stored { plain: plain.len() }
}

/// Raw-deflates `plain` onto the end of `out` if the result is at most `limit` bytes;
/// returns the compressed length.
///
/// The engine always gets room for its worst case (level 1 codes with the fixed Huffman
/// table only, up to 9 bits a byte): zlib-rs has had bugs on the path where the output
/// runs out before the end (zlib-rs issue #169), and a gateway must not panic on data.
fn deflate(level: u8, plain: &[u8], out: &mut Vec<u8>, limit: usize) -> Option<usize> {
    thread_local! {
        /// One engine per level used on this thread (each chunk is a fresh stream).
        static ENGINES: RefCell<[Option<Box<Compress>>; 10]> = const { RefCell::new([const { None }; 10]) };
    }
    ENGINES.with(|engines| {
        let mut engines = engines.borrow_mut();
        let engine = engines[usize::from(level)]
            .get_or_insert_with(|| Box::new(Compress::new(Compression::new(level.into()), false)));
        engine.reset();
        let start = out.len();
        out.resize(start + plain.len() + plain.len() / 8 + 64, 0);
        let result = engine.compress(plain, &mut out[start..], FlushCompress::Finish);
        let written = engine.total_out() as usize;
        let fits = matches!(result, Ok(Status::StreamEnd)) && written <= limit;
        out.truncate(start + if fits { written } else { 0 });
        fits.then_some(written)
    })
}

/// Shannon entropy in bits per byte of a sample of `data` (all of it up to 4 KiB).
fn entropy(data: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    let mut total = 0usize;
    let mut count = |run: &[u8]| {
        for &b in run {
            counts[usize::from(b)] += 1;
        }
        total += run.len();
    };
    if data.len() <= SAMPLE_RUNS * SAMPLE_RUN {
        count(data);
    } else {
        let stride = (data.len() - SAMPLE_RUN) / (SAMPLE_RUNS - 1);
        for i in 0..SAMPLE_RUNS {
            count(&data[i * stride..i * stride + SAMPLE_RUN]);
        }
    }
    let n = total as f64;
    let sum: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let c = f64::from(c);
            c * c.log2()
        })
        .sum();
    n.log2() - sum / n
}

/// A chunk's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes in the header.
    pub len: usize,
    /// Payload bytes after the header.
    pub wire: usize,
    /// Plain bytes the payload decodes to.
    pub plain: usize,
    /// Whether the payload is deflated (or stored).
    pub deflated: bool,
}

/// Why a chunk cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("unknown chunk kind {0}")]
    Kind(u8),
    #[error("chunk length {0} beyond the limit of {MAX_CHUNK} bytes")]
    Length(usize),
    #[error("deflated chunk of {wire} bytes for {plain} plain bytes")]
    Expands { wire: usize, plain: usize },
    #[error("corrupt deflate data")]
    Corrupt,
    #[error("deflate data does not produce the declared {0} bytes")]
    WrongLength(usize),
    #[error("the stream ends inside a chunk")]
    Truncated,
}

impl Header {
    /// Parses the header at the start of `bytes`: `Ok(None)` if more bytes are needed.
    pub fn parse(bytes: &[u8]) -> Result<Option<Header>, ChunkError> {
        let Some(&kind) = bytes.first() else {
            return Ok(None);
        };
        let len = Self::len_for(kind)?;
        let Some(bytes) = bytes.get(..len) else {
            return Ok(None);
        };
        let wire = usize::from(u16::from_be_bytes([bytes[1], bytes[2]]));
        let (plain, deflated) = if kind == KIND_DEFLATE {
            (usize::from(u16::from_be_bytes([bytes[3], bytes[4]])), true)
        } else {
            (wire, false)
        };
        if plain > MAX_CHUNK {
            return Err(ChunkError::Length(plain));
        }
        if deflated && wire >= plain {
            return Err(ChunkError::Expands { wire, plain });
        }
        Ok(Some(Header {
            len,
            wire,
            plain,
            deflated,
        }))
    }

    /// The header's length from its first byte.
    pub fn len_for(kind: u8) -> Result<usize, ChunkError> {
        match kind {
            KIND_STORED => Ok(3),
            KIND_DEFLATE => Ok(5),
            _ => Err(ChunkError::Kind(kind)),
        }
    }
}

/// Decodes a deflated chunk's `payload` into `out`, which must be exactly
/// `header.plain` bytes long. (A stored payload is the plain text itself.)
pub fn inflate(payload: &[u8], out: &mut [u8]) -> Result<(), ChunkError> {
    thread_local! {
        static ENGINE: RefCell<Option<Box<Decompress>>> = const { RefCell::new(None) };
    }
    ENGINE.with(|engine| {
        let mut engine = engine.borrow_mut();
        let engine = engine.get_or_insert_with(|| Box::new(Decompress::new(false)));
        engine.reset(false);
        match engine.decompress(payload, out, FlushDecompress::Finish) {
            Ok(Status::StreamEnd)
                if engine.total_out() as usize == out.len()
                    && engine.total_in() as usize == payload.len() =>
            {
                Ok(())
            }
            Ok(_) => Err(ChunkError::WrongLength(out.len())),
            Err(_) => Err(ChunkError::Corrupt),
        }
    })
}

/// Decodes a whole chunked stream held in memory (tests and tools): the plain bytes, or the
/// first error. A stream ending inside a chunk is an error.
pub fn decode_all(mut bytes: &[u8]) -> Result<Vec<u8>, ChunkError> {
    let mut plain = Vec::new();
    while !bytes.is_empty() {
        let header = Header::parse(bytes)?.ok_or(ChunkError::Truncated)?;
        let payload = bytes
            .get(header.len..header.len + header.wire)
            .ok_or(ChunkError::Truncated)?;
        if header.deflated {
            let at = plain.len();
            plain.resize(at + header.plain, 0);
            inflate(payload, &mut plain[at..])?;
        } else {
            plain.extend_from_slice(payload);
        }
        bytes = &bytes[header.len + header.wire..];
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize, seed: u64) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "the ",
            "tunnel ",
            "carries ",
            "streams ",
            "of ",
            "bytes ",
            "across ",
            "a ",
            "long ",
            "and ",
            "lossy ",
            "path, ",
            "while ",
            "gateways ",
            "repair ",
            "losses. ",
        ];
        let mut rng = fastrand_like(seed);
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            out.extend_from_slice(WORDS[(rng() % WORDS.len() as u64) as usize].as_bytes());
        }
        out.truncate(len);
        out
    }

    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand_like(seed);
        (0..len).map(|_| rng() as u8).collect()
    }

    /// A small xorshift so the tests need no generator crate.
    fn fastrand_like(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s >> 24
        }
    }

    fn encode_all(c: &mut Compressor, data: &[u8]) -> (Vec<u8>, Vec<Encoded>) {
        let mut out = Vec::new();
        let chunks = data
            .chunks(MAX_CHUNK)
            .map(|chunk| c.encode(chunk, &mut out))
            .collect();
        (out, chunks)
    }

    #[test]
    fn text_deflates_and_comes_back() {
        let data = text(200_000, 1);
        let (wire, chunks) = encode_all(&mut Compressor::new(1), &data);
        assert!(chunks.iter().all(|c| matches!(c, Encoded::Deflated { .. })));
        assert!(
            wire.len() * 2 < data.len(),
            "{} of {}",
            wire.len(),
            data.len()
        );
        assert_eq!(chunks.iter().map(|c| c.wire()).sum::<usize>(), wire.len());
        assert_eq!(decode_all(&wire), Ok(data));
    }

    #[test]
    fn random_data_is_stored_with_a_three_byte_header_per_chunk() {
        let data = random(1 << 20, 2);
        let mut c = Compressor::new(6);
        let (wire, chunks) = encode_all(&mut c, &data);
        assert_eq!(wire.len(), data.len() + 3 * chunks.len());
        assert!(wire.len() * 100 < data.len() * 101);
        // The entropy check catches it: deflate never ran.
        assert!(chunks.iter().all(|c| matches!(c, Encoded::Stored { .. })));
        assert_eq!(decode_all(&wire), Ok(data));
    }

    #[test]
    fn data_deflate_cannot_shrink_makes_the_stream_back_off() {
        // 180 byte values drawn uniformly: 7.49 bits a byte passes the entropy check, and
        // with no repeats to find, deflate cannot save 3 %.
        let mut rng = fastrand_like(3);
        let data: Vec<u8> = (0..64 * MAX_CHUNK).map(|_| (rng() % 180) as u8).collect();
        let mut c = Compressor::new(1);
        let (wire, chunks) = encode_all(&mut c, &data);
        let tried: Vec<usize> = (0..chunks.len())
            .filter(|&i| !matches!(chunks[i], Encoded::Stored { .. }))
            .collect();
        assert!(
            tried
                .iter()
                .all(|&i| matches!(chunks[i], Encoded::Incompressible { .. }))
        );
        // Tries after 0, 1, 3, 7, 15 and 31 stored chunks.
        assert_eq!(tried, [0, 1, 3, 7, 15, 31, 63]);
        assert_eq!(decode_all(&wire), Ok(data));
    }

    #[test]
    fn a_good_chunk_ends_the_back_off() {
        let mut c = Compressor::new(1);
        let mut out = Vec::new();
        let noise = random(MAX_CHUNK, 4);
        for _ in 0..20 {
            c.encode(&noise, &mut out);
        }
        // Backing off now; after at most 64 stored chunks text deflates again, and the
        // next text chunk too.
        let words = text(MAX_CHUNK, 5);
        let first =
            (0..70).position(|_| matches!(c.encode(&words, &mut out), Encoded::Deflated { .. }));
        assert!(first.is_some());
        assert!(matches!(
            c.encode(&words, &mut out),
            Encoded::Deflated { .. }
        ));
    }

    #[test]
    fn short_chunks_and_level_zero_are_stored() {
        let mut out = Vec::new();
        let words = text(63, 6);
        assert_eq!(
            Compressor::new(9).encode(&words, &mut out),
            Encoded::Stored { plain: 63 }
        );
        let words = text(MAX_CHUNK, 6);
        assert!(matches!(
            Compressor::new(0).encode(&words, &mut out),
            Encoded::Stored { .. }
        ));
        assert!(matches!(
            Compressor::new(1).encode(&[], &mut out),
            Encoded::Stored { plain: 0 }
        ));
        let mut expect = text(63, 6);
        expect.extend_from_slice(&words);
        assert_eq!(decode_all(&out), Ok(expect));
    }

    #[test]
    fn a_head_and_the_plain_bytes_after_it_are_the_chunk() {
        // Text, noise (stored after the entropy check), a short piece, and text deflate
        // cannot shrink (tried, then stored): each kind of chunk, and the back-off between.
        let mut pieces = vec![text(MAX_CHUNK, 7), random(MAX_CHUNK, 8), text(40, 9)];
        let mut rng = fastrand_like(10);
        pieces.push((0..MAX_CHUNK).map(|_| (rng() % 180) as u8).collect());
        pieces.push(text(MAX_CHUNK, 11));
        let (mut whole, mut split) = (Compressor::new(1), Compressor::new(1));
        let (mut expect, mut got) = (Vec::new(), Vec::new());
        for piece in &pieces {
            let chunk = whole.encode(piece, &mut expect);
            let head = split.encode_head(piece, &mut got);
            assert_eq!(chunk, head);
            if head.is_stored() {
                got.extend_from_slice(piece);
            }
        }
        assert_eq!(got, expect);
        assert_eq!(decode_all(&got), Ok(pieces.concat()));
    }

    #[test]
    fn entropy_of_known_distributions() {
        assert!(entropy(&[7; 1000]) < 1e-9);
        let two: Vec<u8> = (0..1000).map(|i| (i % 2) as u8).collect();
        assert!((entropy(&two) - 1.0).abs() < 1e-9);
        assert!(entropy(&random(MAX_CHUNK, 7)) > 7.9);
        assert!(entropy(&text(MAX_CHUNK, 8)) < 5.0);
    }

    #[test]
    fn hostile_headers_are_refused_before_the_payload() {
        assert_eq!(Header::parse(&[]), Ok(None));
        assert_eq!(Header::parse(&[1, 0, 9, 0]), Ok(None));
        assert_eq!(Header::parse(&[2, 0, 0]), Err(ChunkError::Kind(2)));
        assert_eq!(
            Header::parse(&[0, 0x40, 0x01]),
            Err(ChunkError::Length(MAX_CHUNK + 1))
        );
        assert_eq!(
            Header::parse(&[1, 0, 10, 0, 10]),
            Err(ChunkError::Expands {
                wire: 10,
                plain: 10
            })
        );
        // A deflate stream of "aaaa…" claiming a different length.
        let mut out = Vec::new();
        Compressor::new(1).encode(&[b'a'; 1000], &mut out);
        let header = Header::parse(&out)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!());
        let mut short = vec![0; 999];
        assert_eq!(
            inflate(&out[header.len..], &mut short),
            Err(ChunkError::WrongLength(999))
        );
        let mut long = vec![0; 1001];
        assert_eq!(
            inflate(&out[header.len..], &mut long),
            Err(ChunkError::WrongLength(1001))
        );
        let mut right = vec![0; 1000];
        assert_eq!(inflate(&out[header.len..], &mut right), Ok(()));
        assert_eq!(inflate(&[0xff; 20], &mut right), Err(ChunkError::Corrupt));
        assert_eq!(
            decode_all(&out[..out.len() - 1]),
            Err(ChunkError::Truncated)
        );
    }
}

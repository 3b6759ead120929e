//! Session data on a tunnel stream, in compressed chunks.
//!
//! Both directions of every stream between two gateways are a sequence of chunks
//! ([`wsx_compress`]): a chunk is deflated when that pays and stored when it does not,
//! each one a fresh deflate stream, so a session carries no compression state beyond a few
//! bytes and the buffers below. Each gateway decides for what it sends (the peer's
//! `compression` setting), and reads whatever arrives.
//!
//! ```text
//!  relay write ─> cut at 16 KiB ─> Compressor (entropy check) ─┬─ store: header, then the
//!                                                              │  relay's bytes ─> stream
//!                                                              └─ deflate ─> out ─> stream
//!  stream ─> header ─┬─ stored: read straight into the relay's buffer
//!                    └─ deflated: payload ─> inflate into the relay's buffer
//! ```
//!
//! Memory per session, while data moves: a deflated chunk waiting for the stream (up to
//! 18.5 KiB: deflate is given its worst case), and a deflated payload being collected (up
//! to 16 KiB). A stored chunk is copied once on the way out, from the relay's buffer into
//! the stream's send buffer together with its header (one vectored write), and never on
//! the way in; a deflated one is inflated
//! straight into the reader's buffer when it has room (the relay's always does when the
//! chunk is the first of a read: a read that already holds data stops before a chunk that
//! does not fit), else through a third buffer of up to 16 KiB.

use crate::relay::Side;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use wsx_compress::{ChunkError, Compressor, Encoded, Header, MAX_CHUNK, MAX_HEADER, inflate};

/// Compression counters of one peer, both directions.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    plain_sent: AtomicU64,
    wire_sent: AtomicU64,
    chunks_deflated: AtomicU64,
    chunks_incompressible: AtomicU64,
    chunks_stored: AtomicU64,
    compress_ns: AtomicU64,
    wire_received: AtomicU64,
    plain_received: AtomicU64,
    inflate_ns: AtomicU64,
}

impl Counters {
    fn sent(&self, chunk: Encoded, took: Duration) {
        self.plain_sent
            .fetch_add(chunk.plain() as u64, Ordering::Relaxed);
        self.wire_sent
            .fetch_add(chunk.wire() as u64, Ordering::Relaxed);
        let kind = match chunk {
            Encoded::Deflated { .. } => &self.chunks_deflated,
            Encoded::Incompressible { .. } => &self.chunks_incompressible,
            Encoded::Stored { .. } => &self.chunks_stored,
        };
        kind.fetch_add(1, Ordering::Relaxed);
        self.compress_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn received(&self, wire: usize, plain: usize, took: Duration) {
        self.wire_received.fetch_add(wire as u64, Ordering::Relaxed);
        self.plain_received
            .fetch_add(plain as u64, Ordering::Relaxed);
        self.inflate_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CompressionStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CompressionStats {
            plain_sent: get(&self.plain_sent),
            wire_sent: get(&self.wire_sent),
            chunks_deflated: get(&self.chunks_deflated),
            chunks_incompressible: get(&self.chunks_incompressible),
            chunks_stored: get(&self.chunks_stored),
            compress_time: Duration::from_nanos(get(&self.compress_ns)),
            wire_received: get(&self.wire_received),
            plain_received: get(&self.plain_received),
            inflate_time: Duration::from_nanos(get(&self.inflate_ns)),
        }
    }
}

/// What compression did for the streams to and from one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CompressionStats {
    /// Session bytes sent, and what they took on the streams (chunk headers included).
    pub plain_sent: u64,
    pub wire_sent: u64,
    /// Chunks sent deflated, stored after deflate did not pay, and stored without trying
    /// (compression off, short, high entropy, or backing off).
    pub chunks_deflated: u64,
    pub chunks_incompressible: u64,
    pub chunks_stored: u64,
    /// CPU time spent choosing and compressing.
    pub compress_time: Duration,
    /// Stream bytes received, and the session bytes they gave.
    pub wire_received: u64,
    pub plain_received: u64,
    /// CPU time spent decoding.
    pub inflate_time: Duration,
}

impl CompressionStats {
    /// Stream bytes per session byte sent (below 1 is a gain); `None` before any.
    pub fn ratio_sent(&self) -> Option<f64> {
        (self.plain_sent > 0).then(|| self.wire_sent as f64 / self.plain_sent as f64)
    }
}

/// How a session's stream is coded: this gateway's level for the peer (0 stores), and the
/// peer's counters.
#[derive(Debug, Clone)]
pub(crate) struct Codec {
    pub(crate) level: u32,
    pub(crate) counters: Arc<Counters>,
}

/// Where the reader is in the chunk sequence.
#[derive(Debug)]
enum ReadState {
    /// Collecting a header: `head[..have]`.
    Header { have: usize },
    /// Passing a stored payload through: bytes left.
    Stored { left: usize },
    /// Collecting a deflated payload into `payload`.
    Deflated { header: Header },
}

/// A tunnel stream carrying chunks; see the module documentation.
#[derive(Debug)]
pub(crate) struct Chunked<S> {
    inner: S,
    compressor: Compressor,
    counters: Arc<Counters>,
    /// Encoded bytes and how much of them the stream has taken: a deflated chunk, or a
    /// stored chunk's header.
    out: Vec<u8>,
    out_at: usize,
    /// Payload bytes of the stored chunk whose header is in `out` (or was taken) still to
    /// come from the caller's writes.
    owed: usize,
    head: [u8; MAX_HEADER],
    state: ReadState,
    payload: Vec<u8>,
    /// Inflated bytes the reader had no room for.
    plain: Vec<u8>,
    plain_at: usize,
}

impl<S> Chunked<S> {
    pub(crate) fn new(inner: S, codec: Codec) -> Self {
        Self {
            inner,
            compressor: Compressor::new(codec.level),
            counters: codec.counters,
            out: Vec::new(),
            out_at: 0,
            owed: 0,
            head: [0; MAX_HEADER],
            state: ReadState::Header { have: 0 },
            payload: Vec::new(),
            plain: Vec::new(),
            plain_at: 0,
        }
    }
}

fn invalid(e: ChunkError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, ChunkError::Truncated)
}

impl<S: AsyncWrite + Unpin> Chunked<S> {
    /// Hands the encoded bytes to the stream.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_at < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        self.out_done();
        Poll::Ready(Ok(()))
    }

    /// `out` was taken whole. A deflated chunk's room is given back, not kept: an idle
    /// session holds no chunk buffer (the allocator reuses the memory for the next chunk,
    /// of this session or another); a header's few bytes are kept for the next one.
    fn out_done(&mut self) {
        // A header's push takes the allocator's smallest block (8 bytes for a Vec<u8>).
        if self.out.capacity() > 64 {
            self.out = Vec::new();
        }
        self.out.clear();
        self.out_at = 0;
    }

    /// Writes up to `owed` bytes of `data`, the payload of the stored chunk under way,
    /// behind what is left of its header.
    fn poll_payload(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let payload = &data[..data.len().min(self.owed)];
        loop {
            let head = &self.out[self.out_at..];
            let n = if head.is_empty() {
                ready!(Pin::new(&mut self.inner).poll_write(cx, payload))?
            } else {
                let parts = [IoSlice::new(head), IoSlice::new(payload)];
                ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &parts))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let of_head = n.min(head.len());
            self.out_at += of_head;
            if self.out_at == self.out.len() {
                self.out_done();
            }
            let taken = n - of_head;
            if taken > 0 {
                self.owed -= taken;
                return Poll::Ready(Ok(taken));
            }
            // Only (some of) the header went: the payload's turn again.
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Chunked<S> {
    /// Takes at most one chunk's worth of `data`. A stored chunk's payload goes to the
    /// stream straight from `data`, so its header, once written, announces bytes that only
    /// the caller still has: a caller refused (`Pending`) writes the same bytes again, as
    /// every caller of `poll_write` does, and shutting down before the chunk is complete
    /// is an error.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.owed == 0 {
            ready!(this.poll_drain(cx))?;
            let plain = &data[..data.len().min(MAX_CHUNK)];
            let start = Instant::now();
            let chunk = this.compressor.encode_head(plain, &mut this.out);
            this.counters.sent(chunk, start.elapsed());
            if !chunk.is_stored() {
                // Start it on its way; what the stream does not take now waits for the
                // next call.
                if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(plain.len()));
            }
            this.owed = plain.len();
        }
        this.poll_payload(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.owed > 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                ChunkError::Truncated,
            )));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// What a step of the reader left to do.
enum Step {
    /// Go on with the next state.
    Again,
    /// The read is complete: bytes were put in the caller's buffer, or the stream ended
    /// cleanly between chunks.
    Done,
}

impl<S: AsyncRead + Unpin> AsyncRead for Chunked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Chunk after chunk while `buf` has room and the stream has them, so that a relay
        // woken for data writes what came in one socket write, not one per 16 KiB chunk
        // (ten sessions at 100 Mbit/s: 1,100 writes a second of 11 KB on the receiving
        // gateway). Once something is in `buf`, a stream with nothing more (or an error)
        // ends the read with what it has: every error here comes back on the next read (the
        // state is left where it failed, and the inner stream's errors, like the tunnel
        // stream's, stay).
        let start = buf.filled().len();
        loop {
            let before = buf.filled().len();
            let holding = before > start;
            match this.poll_chunk(cx, buf, holding) {
                Poll::Ready(Ok(())) if buf.filled().len() > before && buf.remaining() > 0 => {}
                Poll::Ready(Err(_)) | Poll::Pending if buf.filled().len() > start => {
                    return Poll::Ready(Ok(()));
                }
                other => return other,
            }
        }
    }
}

impl<S: AsyncRead + Unpin> Chunked<S> {
    /// Reads from the next chunk (or the rest of the current one) into `buf`; nothing read
    /// is the end of the stream, or, when `buf` already holds data (`holding`), a deflated
    /// chunk that does not fit in what is left of it: it is inflated by the next read,
    /// straight into its buffer rather than through `plain`.
    fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        holding: bool,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.plain_at < self.plain.len() {
                let n = buf.remaining().min(self.plain.len() - self.plain_at);
                buf.put_slice(&self.plain[self.plain_at..self.plain_at + n]);
                self.plain_at += n;
                if self.plain_at == self.plain.len() {
                    self.plain = Vec::new();
                    self.plain_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let step = match self.state {
                ReadState::Header { have } => ready!(self.poll_header(cx, have))?,
                ReadState::Stored { left: 0 } => {
                    self.state = ReadState::Header { have: 0 };
                    Step::Again
                }
                ReadState::Stored { left } => ready!(self.poll_stored(cx, buf, left))?,
                ReadState::Deflated { header } => {
                    ready!(self.poll_deflated(cx, buf, header, holding))?
                }
            };
            if let Step::Done = step {
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Collects a chunk header (`have` bytes of it so far) and moves to its payload.
    fn poll_header(&mut self, cx: &mut Context<'_>, have: usize) -> Poll<io::Result<Step>> {
        let need = match have {
            0 => 1,
            _ => Header::len_for(self.head[0]).map_err(invalid)?,
        };
        if have < need {
            let mut dst = ReadBuf::new(&mut self.head[have..need]);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut dst))?;
            let n = dst.filled().len();
            if n == 0 {
                // The end of the stream is fine between chunks only.
                return Poll::Ready(if have == 0 {
                    Ok(Step::Done)
                } else {
                    Err(truncated())
                });
            }
            self.state = ReadState::Header { have: have + n };
            return Poll::Ready(Ok(Step::Again));
        }
        let header = Header::parse(&self.head[..have])
            .map_err(invalid)?
            .ok_or_else(truncated)?;
        if header.deflated {
            self.payload.clear();
            self.payload.reserve_exact(header.wire);
            self.state = ReadState::Deflated { header };
        } else {
            // The header's own bytes are counted with its payload.
            self.counters
                .received(header.len + header.wire, header.wire, Duration::ZERO);
            self.state = ReadState::Stored { left: header.wire };
        }
        Poll::Ready(Ok(Step::Again))
    }

    /// Reads a stored payload (`left` bytes of it to go) straight into `buf`.
    fn poll_stored(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        left: usize,
    ) -> Poll<io::Result<Step>> {
        let room = left.min(buf.remaining());
        let mut dst = ReadBuf::new(buf.initialize_unfilled_to(room));
        ready!(Pin::new(&mut self.inner).poll_read(cx, &mut dst))?;
        let n = dst.filled().len();
        if n == 0 {
            return Poll::Ready(Err(truncated()));
        }
        buf.advance(n);
        self.state = ReadState::Stored { left: left - n };
        Poll::Ready(Ok(Step::Done))
    }

    /// Collects a deflated payload, then inflates it into `buf`, or into `plain` when `buf`
    /// has less room than the chunk holds; unless `buf` already holds data (`holding`):
    /// then the chunk waits, collected, for the next read.
    fn poll_deflated(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        header: Header,
        holding: bool,
    ) -> Poll<io::Result<Step>> {
        let have = self.payload.len();
        if have < header.wire {
            self.payload.resize(header.wire, 0);
            let mut dst = ReadBuf::new(&mut self.payload[have..]);
            let polled = Pin::new(&mut self.inner).poll_read(cx, &mut dst);
            let n = dst.filled().len();
            self.payload.truncate(have + n);
            ready!(polled)?;
            if n == 0 {
                return Poll::Ready(Err(truncated()));
            }
            return Poll::Ready(Ok(Step::Again));
        }
        if holding && buf.remaining() < header.plain {
            return Poll::Ready(Ok(Step::Done));
        }
        let start = Instant::now();
        if buf.remaining() >= header.plain {
            let dst = buf.initialize_unfilled_to(header.plain);
            inflate(&self.payload, dst).map_err(invalid)?;
            buf.advance(header.plain);
        } else {
            self.plain.resize(header.plain, 0);
            if let Err(e) = inflate(&self.payload, &mut self.plain) {
                // Nothing of a chunk that does not inflate is handed out, now or later.
                self.plain.clear();
                return Poll::Ready(Err(invalid(e)));
            }
        }
        self.counters
            .received(header.len + header.wire, header.plain, start.elapsed());
        self.payload = Vec::new();
        self.state = ReadState::Header { have: 0 };
        Poll::Ready(Ok(if self.plain.is_empty() {
            Step::Done
        } else {
            Step::Again
        }))
    }
}

impl<S: Side> Side for Chunked<S> {
    fn abort(self, code: u64) {
        self.inner.abort(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    impl Side for DuplexStream {
        fn abort(self, _code: u64) {}
    }

    fn codec(level: u32) -> Codec {
        Codec {
            level,
            counters: Arc::default(),
        }
    }

    fn text(len: usize) -> Vec<u8> {
        let words = ["alpha ", "beta ", "gamma ", "delta ", "epsilon. "];
        let mut x = 7u32;
        let mut out = Vec::new();
        while out.len() < len {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            out.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
        }
        out.truncate(len);
        out
    }

    fn random(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// Writes `data` through a chunked writer into a small pipe (so writes block and resume
    /// mid-chunk), reads it back through a chunked reader with a reader buffer of
    /// `read_size`, and returns what arrived and the writer's counters.
    async fn through(data: &[u8], level: u32, read_size: usize) -> (Vec<u8>, CompressionStats) {
        let (a, b) = tokio::io::duplex(4096);
        let sender = codec(level);
        let counters = sender.counters.clone();
        let mut writer = Chunked::new(a, sender);
        let mut reader = Chunked::new(b, codec(0));
        let data = data.to_vec();
        let write = tokio::spawn(async move {
            for piece in data.chunks(50_000) {
                writer.write_all(piece).await?;
            }
            writer.shutdown().await
        });
        let mut got = Vec::new();
        let mut buf = vec![0; read_size];
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        write
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        (got, counters.snapshot())
    }

    #[tokio::test]
    async fn text_random_and_mixed_streams_come_back_exactly() {
        let mut mixed = text(100_000);
        mixed.extend(random(100_000));
        mixed.extend(text(30_000));
        for data in [text(300_000), random(300_000), mixed] {
            for read_size in [1, 100, 20_000, 65_536] {
                let (got, _) = through(&data, 2, read_size).await;
                assert!(got == data, "read size {read_size}");
            }
        }
    }

    /// A stream that refuses every other write and takes a few bytes of the rest, across
    /// the parts of a vectored write: a stored chunk's header and payload are cut at
    /// every place.
    #[derive(Default)]
    struct Stingy {
        got: Vec<u8>,
        calls: usize,
    }

    impl AsyncWrite for Stingy {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(data)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            parts: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.calls += 1;
            if self.calls % 2 == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut left = 1 + self.calls % 7;
            let mut taken = 0;
            for part in parts {
                let n = part.len().min(left);
                self.got.extend_from_slice(&part[..n]);
                (left, taken) = (left - n, taken + n);
            }
            Poll::Ready(Ok(taken))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn stored_chunks_written_behind_their_headers_in_pieces_are_the_chunks() {
        let mut data = text(40_000);
        data.extend(random(70_000));
        data.extend(text(20_000));
        let mut writer = Chunked::new(Stingy::default(), codec(1));
        writer
            .write_all(&data)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        writer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(writer.owed, 0);
        assert!(writer.inner.calls > 2 * data.len() / 7, "written in pieces");
        let got = wsx_compress::decode_all(&writer.inner.got).unwrap_or_else(|e| panic!("{e}"));
        assert!(got == data);
    }

    #[tokio::test]
    async fn shutting_down_inside_a_stored_chunk_is_an_error() {
        let mut writer = Chunked::new(Stingy::default(), codec(0));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let poll = Pin::new(&mut writer).poll_write(&mut cx, &random(1000));
        assert!(poll.is_pending(), "the stream refused its first write");
        assert_eq!(writer.owed, 1000, "the header is encoded, the payload owed");
        let e = writer.shutdown().await.err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    }

    #[tokio::test]
    async fn text_shrinks_and_random_costs_under_one_percent() {
        let data = text(1 << 20);
        let (_, stats) = through(&data, 2, 65_536).await;
        assert_eq!(stats.plain_sent, data.len() as u64);
        let ratio = stats.ratio_sent().unwrap_or(1.0);
        assert!(ratio < 0.5, "{stats:?}");

        let data = random(1 << 20);
        let (_, stats) = through(&data, 2, 65_536).await;
        assert!(stats.wire_sent < stats.plain_sent * 101 / 100, "{stats:?}");
        assert_eq!(stats.chunks_deflated, 0);

        let (_, stats) = through(&text(100_000), 0, 65_536).await;
        assert_eq!(stats.chunks_deflated + stats.chunks_incompressible, 0);
    }

    /// `data` cut into chunks and already arrived: the pipe's open sending end, and a chunked
    /// reader of the other.
    async fn arrived(data: &[u8]) -> (DuplexStream, Chunked<DuplexStream>) {
        let mut wire = Vec::new();
        let mut compressor = Compressor::new(2);
        for piece in data.chunks(MAX_CHUNK) {
            compressor.encode(piece, &mut wire);
        }
        let (mut a, b) = tokio::io::duplex(1 << 20);
        a.write_all(&wire).await.unwrap_or_else(|e| panic!("{e}"));
        (a, Chunked::new(b, codec(0)))
    }

    /// What has arrived comes out in one read, chunk after chunk, as far as the reader's
    /// buffer goes; data ahead of a broken chunk is handed out before its error.
    #[tokio::test]
    async fn one_read_takes_every_chunk_that_has_arrived() {
        let mut data = random(40_000);
        data.extend(text(40_000));
        let (mut a, mut reader) = arrived(&data).await;
        let mut buf = vec![0; 1 << 17];
        let n = reader
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(buf[..n] == data[..], "{n} bytes in the first read");
        // A whole chunk, then garbage: the chunk first, the error on the next read.
        let mut first = Vec::new();
        Compressor::new(2).encode(&data[..MAX_CHUNK], &mut first);
        first.extend_from_slice(&[9u8, 0, 0]);
        a.write_all(&first).await.unwrap_or_else(|e| panic!("{e}"));
        let n = reader
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            buf[..n] == data[..MAX_CHUNK],
            "{n} bytes before the garbage"
        );
        let err = reader.read(&mut buf).await.err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::InvalidData));
    }

    /// A read holding data stops before a deflated chunk that does not fit in what is left,
    /// so that the next read inflates it straight into its buffer.
    #[tokio::test]
    async fn a_read_stops_before_a_deflated_chunk_it_has_no_room_for() {
        let mut data = random(MAX_CHUNK);
        data.extend(text(MAX_CHUNK));
        let (_a, mut reader) = arrived(&data).await;
        let mut buf = vec![0; MAX_CHUNK + MAX_CHUNK / 4];
        let mut got = Vec::new();
        for _ in 0..2 {
            let n = reader
                .read(&mut buf)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(n, MAX_CHUNK);
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == data);
        assert!(reader.plain.capacity() == 0, "the spill buffer was used");
    }

    /// A deflated chunk that fails to inflate through the spill buffer leaves nothing in it
    /// to hand out: the next read fails again.
    #[tokio::test]
    async fn a_chunk_that_does_not_inflate_yields_nothing_later() {
        let mut wire = Vec::new();
        Compressor::new(2).encode(&text(5000), &mut wire);
        let middle = wire.len() / 2;
        wire[middle] ^= 0xff;
        wire[middle + 1] ^= 0x5a;
        let (mut a, b) = tokio::io::duplex(1 << 16);
        a.write_all(&wire).await.unwrap_or_else(|e| panic!("{e}"));
        drop(a);
        let mut reader = Chunked::new(b, codec(0));
        let mut buf = [0u8; 100];
        for _ in 0..2 {
            let got = reader.read(&mut buf).await.map_err(|e| e.kind());
            assert_eq!(got, Err(io::ErrorKind::InvalidData));
        }
    }

    #[tokio::test]
    async fn a_stream_ending_inside_a_chunk_or_carrying_garbage_is_an_error() {
        let mut wire = Vec::new();
        Compressor::new(2).encode(&text(5000), &mut wire);
        for (bytes, kind) in [
            (&wire[..wire.len() - 1], io::ErrorKind::UnexpectedEof),
            (&wire[..2], io::ErrorKind::UnexpectedEof),
            (&[9u8, 0, 0][..], io::ErrorKind::InvalidData),
            (
                &[1u8, 0, 4, 0, 8, 0xff, 0xff, 0xff, 0xff][..],
                io::ErrorKind::InvalidData,
            ),
        ] {
            let (mut a, b) = tokio::io::duplex(1 << 16);
            a.write_all(bytes).await.unwrap_or_else(|e| panic!("{e}"));
            drop(a);
            let mut reader = Chunked::new(b, codec(0));
            let mut sink = Vec::new();
            let err = reader.read_to_end(&mut sink).await.err();
            assert_eq!(err.map(|e| e.kind()), Some(kind), "{bytes:?}");
        }
    }
}

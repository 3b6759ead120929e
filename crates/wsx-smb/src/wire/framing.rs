//! Direct TCP transport framing (MS-SMB2 2.1): every SMB2 message, or
//! chain of compounded messages, travels in a frame of one zero byte and a 24-bit big-endian
//! length. Frames span TCP segments and segments hold several frames, so a reader of the byte
//! stream must reassemble them.
//!
//! [`Deframer`] does that incrementally for an observer that needs only each frame's start
//! (headers and fixed-size bodies) and not its payload (a READ response may carry 8 MiB): it
//! hands out the first [`Deframer::keep`] bytes of every frame, borrowed from the input when
//! they arrive in one piece and copied only when they straddle two reads, and skips the rest
//! without touching it. [`Frames`] is for a reader that acts on whole frames (the read-ahead
//! engine): each frame's payload in a buffer of its own, every byte copied once.

/// Bytes of the framing header: the zero byte and the 24-bit length.
pub const FRAME_HEADER_LEN: usize = 4;
/// The largest frame the 24-bit length can describe.
pub const MAX_FRAME_LEN: usize = (1 << 24) - 1;

/// One frame's start, as [`Deframer::feed`] hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameStart<'a> {
    /// The frame's first byte: always 0 for SMB; a record's type on the engines' stream
    /// ([`Deframer::typed`]).
    pub kind: u8,
    /// The frame's length, without the framing header.
    pub len: usize,
    /// The frame's first `min(len, keep)` bytes.
    pub prefix: &'a [u8],
}

/// The byte stream is not Direct TCP framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not SMB Direct TCP framing: a frame starts with {0:#04x}, not a zero byte")]
pub struct NotFramed(pub u8);

/// Splits one direction of a TCP 445 byte stream into frames; see the module documentation.
#[derive(Debug, Clone)]
pub struct Deframer {
    keep: usize,
    /// Frames may start with any byte (the engines' records), not only zero.
    typed: bool,
    /// The first byte of the frame being read.
    kind: u8,
    state: State,
    /// The framing header or the prefix, while it straddles reads.
    partial: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a framing header (`partial` holds what arrived of it).
    Header,
    /// Collecting the first bytes of a frame of `len` bytes into `partial`.
    Prefix { len: usize },
    /// Skipping what is left of a frame after its prefix was handed out.
    Skip { left: usize },
    /// The stream was not framed (a frame started with this byte); nothing more is read.
    Failed(u8),
}

impl Deframer {
    /// A deframer that hands out up to `keep` bytes of each frame.
    pub fn new(keep: usize) -> Self {
        Self {
            keep,
            typed: false,
            kind: 0,
            state: State::Header,
            partial: Vec::new(),
        }
    }

    /// A deframer for a stream of typed records of the same shape (the engines' stream,
    /// `engine::link`): any first byte is a record's type.
    pub fn typed(keep: usize) -> Self {
        Self {
            typed: true,
            ..Self::new(keep)
        }
    }

    /// How many bytes of each frame [`FrameStart::prefix`] holds at most.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Whether the stream stopped between frames (a clean end).
    pub fn between_frames(&self) -> bool {
        self.state == State::Header && self.partial.is_empty()
    }

    /// Reads `data`, the next bytes of the stream, calling `on_frame` with the start of every
    /// frame whose prefix is complete. After an error the stream is abandoned: every later
    /// call with bytes returns the error again without reading them.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut on_frame: impl FnMut(FrameStart<'_>),
    ) -> Result<(), NotFramed> {
        while !data.is_empty() {
            match self.state {
                State::Failed(byte) => return Err(NotFramed(byte)),
                State::Header => {
                    if self.partial.is_empty() && data.len() >= FRAME_HEADER_LEN {
                        let len = self.header(&data[..FRAME_HEADER_LEN])?;
                        data = &data[FRAME_HEADER_LEN..];
                        let want = len.min(self.keep);
                        if data.len() >= want {
                            // The common case: the whole prefix is in this read.
                            on_frame(FrameStart {
                                kind: self.kind,
                                len,
                                prefix: &data[..want],
                            });
                            data = &data[want..];
                            self.state = State::Skip { left: len - want };
                        } else {
                            self.state = State::Prefix { len };
                        }
                    } else {
                        let take = (FRAME_HEADER_LEN - self.partial.len()).min(data.len());
                        self.partial.extend_from_slice(&data[..take]);
                        data = &data[take..];
                        if self.partial.len() == FRAME_HEADER_LEN {
                            let header: [u8; FRAME_HEADER_LEN] = [
                                self.partial[0],
                                self.partial[1],
                                self.partial[2],
                                self.partial[3],
                            ];
                            self.partial.clear();
                            let len = self.header(&header)?;
                            self.state = State::Prefix { len };
                        }
                    }
                }
                State::Prefix { len } => {
                    let want = len.min(self.keep);
                    let take = (want - self.partial.len()).min(data.len());
                    self.partial.extend_from_slice(&data[..take]);
                    data = &data[take..];
                }
                State::Skip { left } => {
                    let skip = left.min(data.len());
                    data = &data[skip..];
                    self.state = if left == skip {
                        State::Header
                    } else {
                        State::Skip { left: left - skip }
                    };
                }
            }
            self.prefix_complete(&mut on_frame);
        }
        if let State::Skip { left: 0 } = self.state {
            self.state = State::Header;
        }
        Ok(())
    }

    /// Hands out the prefix collected in `partial` once it is complete (at once for a frame
    /// of zero bytes, or with `keep` zero).
    fn prefix_complete(&mut self, on_frame: &mut impl FnMut(FrameStart<'_>)) {
        if let State::Prefix { len } = self.state
            && self.partial.len() == len.min(self.keep)
        {
            on_frame(FrameStart {
                kind: self.kind,
                len,
                prefix: &self.partial,
            });
            self.state = State::Skip {
                left: len - self.partial.len(),
            };
            self.partial.clear();
        }
    }

    /// Reads a framing header: the frame's length, or the error that abandons the stream.
    fn header(&mut self, header: &[u8]) -> Result<usize, NotFramed> {
        if header[0] != 0 && !self.typed {
            self.state = State::Failed(header[0]);
            self.partial.clear();
            return Err(NotFramed(header[0]));
        }
        self.kind = header[0];
        Ok(usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]))
    }
}

/// Writes the framing header of a frame of `len` bytes; `None` if `len` does not fit 24 bits.
pub fn frame_header(len: usize) -> Option<[u8; FRAME_HEADER_LEN]> {
    (len <= MAX_FRAME_LEN).then_some([0, (len >> 16) as u8, (len >> 8) as u8, len as u8])
}

/// The most [`Frames`] reserves for a frame before its bytes come.
const INITIAL_ROOM: usize = 256 << 10;

/// Splits a byte stream into whole frames, in the order they come. Each payload is copied
/// once, from the input into a buffer of its own that the caller then owns.
#[derive(Debug, Default)]
pub struct Frames {
    header: [u8; FRAME_HEADER_LEN],
    /// Bytes of `header` in.
    header_len: usize,
    /// The payload of the frame being read, once its header is in.
    payload: Vec<u8>,
}

impl Frames {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `data`: `each` gets every frame it completes, as its kind (the first byte)
    /// and payload. A frame whose kind `accept` refuses ends the framing: `Err` hands back
    /// the bytes from that frame's first byte to the end of `data`, and nothing more may be
    /// fed.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        accept: impl Fn(u8) -> bool,
        mut each: impl FnMut(u8, Vec<u8>),
    ) -> Result<(), Vec<u8>> {
        while !data.is_empty() {
            if self.header_len < FRAME_HEADER_LEN {
                if self.header_len == 0 && !accept(data[0]) {
                    return Err(data.to_vec());
                }
                let n = (FRAME_HEADER_LEN - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                self.header_len += n;
                data = &data[n..];
                if self.header_len < FRAME_HEADER_LEN {
                    return Ok(());
                }
                // Room as the bytes come, not as the header says: 4 bytes from the network
                // do not reserve 16 MiB.
                self.payload = Vec::with_capacity(self.len().min(INITIAL_ROOM));
            }
            let n = (self.len() - self.payload.len()).min(data.len());
            self.payload.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.payload.len() == self.len() {
                self.header_len = 0;
                each(self.header[0], std::mem::take(&mut self.payload));
            }
        }
        Ok(())
    }

    /// Whether the stream stands between two frames (an end here cuts none).
    pub fn between_frames(&self) -> bool {
        self.header_len == 0
    }

    /// How many of `data`'s bytes reach the end of the frame being read (all of them if it
    /// does not end in `data`).
    pub fn to_frame_end(&self, data: &[u8]) -> usize {
        let need = FRAME_HEADER_LEN - self.header_len;
        if data.len() < need {
            return data.len();
        }
        let mut header = self.header;
        header[self.header_len..].copy_from_slice(&data[..need]);
        let len =
            usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]);
        let have = if need == 0 { self.payload.len() } else { 0 };
        (need + len - have).min(data.len())
    }

    /// Bytes held for the frame being read: room for all of it once its header is in.
    pub fn held(&self) -> usize {
        self.header_len + self.payload.capacity()
    }

    /// What arrived of a frame not yet whole, framing header included, and a fresh start.
    pub fn take_partial(&mut self) -> Vec<u8> {
        let mut partial = self.header[..self.header_len].to_vec();
        partial.append(&mut self.payload);
        self.header_len = 0;
        partial
    }

    fn len(&self) -> usize {
        usize::from(self.header[1]) << 16
            | usize::from(self.header[2]) << 8
            | usize::from(self.header[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            out.extend_from_slice(&frame_header(f.len()).unwrap());
            out.extend_from_slice(f);
        }
        out
    }

    /// Every frame's (length, prefix) after feeding `stream` cut at `cuts`.
    fn starts(
        keep: usize,
        stream: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<(usize, Vec<u8>)>, NotFramed> {
        let mut d = Deframer::new(keep);
        let mut out = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([&stream.len()]) {
            let cut = cut.clamp(at, stream.len());
            d.feed(&stream[at..cut], |f| out.push((f.len, f.prefix.to_vec())))?;
            at = cut;
        }
        Ok(out)
    }

    #[test]
    fn frames_in_one_read_are_handed_out_in_order() {
        let stream = framed(&[vec![1; 100], vec![], vec![2; 3]]);
        let got = starts(10, &stream, &[]).unwrap();
        assert_eq!(got, vec![(100, vec![1; 10]), (0, vec![]), (3, vec![2; 3])]);
    }

    #[test]
    fn a_stream_that_is_not_framed_is_refused_for_good() {
        // A NetBIOS session request (port 139's framing) is not Direct TCP.
        let mut d = Deframer::new(64);
        assert_eq!(
            d.feed(&[0x81, 0, 0, 4, 1, 2, 3, 4], |_| {}),
            Err(NotFramed(0x81))
        );
        assert_eq!(
            d.feed(&[0, 0, 0, 0], |_| panic!("read after failure")),
            Err(NotFramed(0x81))
        );
    }

    #[test]
    fn the_largest_frame_is_described() {
        assert_eq!(frame_header(MAX_FRAME_LEN), Some([0, 0xff, 0xff, 0xff]));
        assert_eq!(frame_header(MAX_FRAME_LEN + 1), None);
    }

    proptest! {
        /// However the stream is cut into reads, the same frames come out, each with its
        /// length and its first `keep` bytes, and the deframer ends between frames.
        #[test]
        fn any_cutting_of_the_stream_gives_the_same_frames(
            frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            keep in 0usize..100,
            cuts in prop::collection::vec(0usize..3000, 0..20),
        ) {
            let stream = framed(&frames);
            let mut cuts = cuts;
            cuts.sort_unstable();
            let got = starts(keep, &stream, &cuts).unwrap();
            let want: Vec<_> = frames
                .iter()
                .map(|f| (f.len(), f[..f.len().min(keep)].to_vec()))
                .collect();
            prop_assert_eq!(got, want);
        }

        /// Any bytes at all: no panic, and once refused always refused.
        #[test]
        fn arbitrary_bytes_never_panic(
            data in prop::collection::vec(any::<u8>(), 0..2000),
            keep in 0usize..100,
            cut in 0usize..2000,
        ) {
            let mut d = Deframer::new(keep);
            let cut = cut.min(data.len());
            let first = d.feed(&data[..cut], |f| assert!(f.prefix.len() <= keep));
            let second = d.feed(&data[cut..], |f| assert!(f.prefix.len() <= keep));
            if first.is_err() {
                prop_assert!(second.is_err() || data[cut..].is_empty());
            }
        }
    }

    proptest! {
        /// Whole frames come out as they went in, however the stream is cut; a frame of a
        /// refused kind hands back the rest of the stream from its first byte.
        #[test]
        fn frames_come_out_whole_however_the_stream_is_cut(
            frames in prop::collection::vec((0u8..3, prop::collection::vec(any::<u8>(), 0..3000)), 0..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut stream = Vec::new();
            for (kind, payload) in &frames {
                let mut header = frame_header(payload.len()).unwrap();
                header[0] = *kind;
                stream.extend_from_slice(&header);
                stream.extend_from_slice(payload);
            }
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
            at.push(0);
            at.push(stream.len());
            at.sort_unstable();
            let mut splitter = Frames::new();
            let mut back = Vec::new();
            let mut rest = None;
            for w in at.windows(2) {
                if rest.is_some() {
                    break;
                }
                if let Err(r) = splitter.feed(&stream[w[0]..w[1]], |k| k < 2, |k, p| back.push((k, p))) {
                    // Everything after this piece, too.
                    let mut r = r;
                    r.extend_from_slice(&stream[w[1]..]);
                    rest = Some(r);
                }
            }
            let accepted: Vec<_> = frames.iter().take_while(|(k, _)| *k < 2).cloned().collect();
            prop_assert_eq!(&back, &accepted);
            let offset: usize = accepted.iter().map(|(_, p)| FRAME_HEADER_LEN + p.len()).sum();
            if accepted.len() < frames.len() {
                let rest = rest.unwrap_or_default();
                // The refused frame's first byte was not in the splitter yet (its kind is
                // judged first): the rest is the stream from it.
                prop_assert_eq!(&rest[..], &stream[offset..]);
            } else {
                prop_assert!(rest.is_none());
                prop_assert!(splitter.between_frames());
            }
        }

        /// Fed up to each frame's end at a time, whatever the pieces, the frames come out
        /// one per call that reaches an end.
        #[test]
        fn feeding_to_each_frame_s_end_gives_one_frame_at_a_time(
            frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..6),
            piece in 1usize..700,
        ) {
            let mut stream = Vec::new();
            for payload in &frames {
                stream.extend_from_slice(&frame_header(payload.len()).unwrap());
                stream.extend_from_slice(payload);
            }
            let mut splitter = Frames::new();
            let mut back = Vec::new();
            for chunk in stream.chunks(piece) {
                let mut rest = chunk;
                while !rest.is_empty() {
                    let n = splitter.to_frame_end(rest);
                    prop_assert!(n > 0);
                    let before = back.len();
                    splitter.feed(&rest[..n], |_| true, |_, p| back.push(p)).unwrap();
                    prop_assert!(back.len() - before <= 1);
                    if back.len() > before {
                        prop_assert!(splitter.between_frames());
                    }
                    rest = &rest[n..];
                }
            }
            prop_assert_eq!(back, frames);
        }

        /// Cut short, a stream's incomplete frame is handed back byte for byte.
        #[test]
        fn an_incomplete_frame_is_handed_back(payload in prop::collection::vec(any::<u8>(), 1..500), cut in any::<prop::sample::Index>()) {
            let mut stream = frame_header(payload.len()).unwrap().to_vec();
            stream.extend_from_slice(&payload);
            let cut = 1 + cut.index(stream.len() - 1);
            let mut splitter = Frames::new();
            let mut whole = 0;
            prop_assert!(splitter.feed(&stream[..cut], |_| true, |_, _| whole += 1).is_ok());
            prop_assert_eq!(whole, 0);
            prop_assert!(!splitter.between_frames());
            prop_assert_eq!(splitter.take_partial(), stream[..cut].to_vec());
            prop_assert!(splitter.between_frames());
        }
    }
}

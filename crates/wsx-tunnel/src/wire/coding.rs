//! Reading and writing the wire's primitive types: big-endian integers and the variable-length
//! integers of RFC 9000 §16 (2-bit length prefix, 1/2/4/8 bytes, values below 2^62).
//!
//! A [`Reader`] never panics: every read past the end is [`Truncated`].

/// The largest value a variable-length integer can carry.
pub(crate) const VARINT_MAX: u64 = (1 << 62) - 1;

/// Input ended before a field did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("truncated input")]
pub(crate) struct Truncated;

/// A cursor over received bytes.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if n > self.bytes.len() {
            return Err(Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Truncated> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn varint(&mut self) -> Result<u64, Truncated> {
        let first = *self.bytes.first().ok_or(Truncated)?;
        let len = 1usize << (first >> 6);
        let raw = self.bytes(len)?;
        let mut value = u64::from(first & 0x3f);
        for &b in &raw[1..] {
            value = (value << 8) | u64::from(b);
        }
        Ok(value)
    }
}

/// A cursor over a caller-owned output buffer. Writers check space before they write
/// (`remaining`), so running out is a bug in the caller: it panics in debug builds through the
/// slice index, as `bytes::BufMut` does.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }

    pub(crate) fn bytes(&mut self, data: &[u8]) {
        self.buf[self.len..self.len + data.len()].copy_from_slice(data);
        self.len += data.len();
    }

    /// Reserves `n` bytes and returns them for the caller to fill.
    pub(crate) fn reserve(&mut self, n: usize) -> &mut [u8] {
        let start = self.len;
        self.len += n;
        &mut self.buf[start..self.len]
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_be_bytes());
    }

    /// Writes `v` as a variable-length integer. `v` must be at most [`VARINT_MAX`]; callers
    /// produce only offsets, ids and counts that are bounded far below it.
    pub(crate) fn varint(&mut self, v: u64) {
        debug_assert!(v <= VARINT_MAX);
        match varint_len(v) {
            1 => self.u8(v as u8),
            2 => self.u16(v as u16 | 0x4000),
            4 => self.u32(v as u32 | 0x8000_0000),
            _ => self.u64(v | 0xc000_0000_0000_0000),
        }
    }
}

/// How many bytes [`Writer::varint`] uses for `v`.
pub(crate) const fn varint_len(v: u64) -> usize {
    if v < 1 << 6 {
        1
    } else if v < 1 << 14 {
        2
    } else if v < 1 << 30 {
        4
    } else {
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc9000_examples_decode() {
        // RFC 9000 §A.1 sample encodings.
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.varint(), Ok(value));
            assert!(r.is_empty());
        }
    }

    #[test]
    fn reads_past_the_end_are_errors() {
        let mut r = Reader::new(&[0x80, 1]);
        assert_eq!(r.varint(), Err(Truncated));
        assert_eq!(Reader::new(&[]).u8(), Err(Truncated));
        assert_eq!(Reader::new(&[1, 2, 3]).u32(), Err(Truncated));
    }

    proptest! {
        #[test]
        fn varint_round_trips(v in 0..=VARINT_MAX) {
            let mut buf = [0u8; 8];
            let mut w = Writer::new(&mut buf);
            w.varint(v);
            let n = w.len();
            prop_assert_eq!(n, varint_len(v));
            let mut r = Reader::new(&buf[..n]);
            prop_assert_eq!(r.varint(), Ok(v));
            prop_assert!(r.is_empty());
        }
    }
}

//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): the parsers of the
//! gateway that see bytes from clients. Not a stable API.

use crate::socks::{self, SocksUser};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Runs `data` as what a SOCKS5 client sends, through the server's handshake, without
/// users and with one: it must end in a destination or an error, never a panic. What the
/// handshake answers is written nowhere.
pub fn socks_handshake(data: &[u8]) {
    let user = SocksUser {
        name: "user".into(),
        password: "secret".into(),
    };
    for users in [&[][..], std::slice::from_ref(&user)] {
        let mut client = Replay { data, at: 0 };
        let mut handshake = std::pin::pin!(socks::handshake(&mut client, users));
        // Every read and write is ready at once, so one poll runs it to the end.
        let polled = handshake
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_ready(), "the handshake waited on a ready stream");
    }
}

/// A client that sends `data`, then ends, and takes whatever it is sent.
struct Replay<'a> {
    data: &'a [u8],
    at: usize,
}

impl AsyncRead for Replay<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = buf.remaining().min(self.data.len() - self.at);
        buf.put_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replay<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_handshakes_end_without_a_panic() {
        let cases: [&[u8]; 7] = [
            &[],
            &[5],
            &[5, 1, 0, 5, 1, 0, 3, 0, 0, 80],
            &[5, 1, 0, 5, 1, 0, 3, 255],
            &[
                5, 1, 2, 1, 4, b'u', b's', b'e', b'r', 6, b's', b'e', b'c', b'r', b'e', b't',
            ],
            &[5, 0],
            &[4, 1, 0, 80, 127, 0, 0, 1, 0],
        ];
        for data in cases {
            socks_handshake(data);
        }
    }
}

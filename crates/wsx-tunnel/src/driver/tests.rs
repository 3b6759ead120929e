//! The driver's own policies, driven directly: deferred reader wake-ups on a simulated
//! connection, receive moderation on arrival times, and a full socket buffer on real
//! loopback sockets.

use super::*;
use crate::testing::{LinkConfig, Pair};
use crate::{SecretKey, Target};
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicUsize;
use std::task::Wake;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counts the wake-ups of a reader.
#[derive(Default)]
struct Reader(AtomicUsize);

impl Wake for Reader {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl Reader {
    fn woken(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// The receiving connection of a simulated path of `rtt` once `bytes` of one stream have
/// arrived there, in the state the driver keeps, with a reader for the stream. The sender
/// wrote `written` bytes: more than `bytes`, the data in is part of a flow still streaming
/// (no PUSH yet); as many, it is all the sender had (its last frame carries PUSH).
fn receiving(
    bytes: usize,
    written: usize,
    rtt: Duration,
) -> (LinkState, StreamId, Arc<Reader>, Instant) {
    let (state, ids, now) = receiving_streams(1, bytes, written, rtt);
    (state, ids[0], Arc::new(Reader::default()), now)
}

/// The same with `streams` streams, each sent `written` bytes, once `bytes` of each are in.
fn receiving_streams(
    streams: usize,
    bytes: usize,
    written: usize,
    rtt: Duration,
) -> (LinkState, Vec<StreamId>, Instant) {
    let link = LinkConfig::new(rtt, 100);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 1);
    pair.connect();
    let meta = StreamMeta {
        destination: Some(Target::Addr(([192, 0, 2, 1], 80).into())),
        ..StreamMeta::default()
    };
    let ids: Vec<StreamId> = (0..streams)
        .map(|_| {
            let id = pair
                .client()
                .open_stream(meta.clone())
                .expect("room for a stream");
            assert_eq!(pair.client().write(id, &vec![7; written]), Ok(written));
            id
        })
        .collect();
    pair.run_until(Duration::from_secs(5), |p| {
        ids.iter().all(|&id| p.server().readable_bytes(id) >= bytes)
    });
    for &id in &ids {
        assert_eq!(pair.server().pushed(id), written <= bytes);
    }
    let (_, connection) = pair.sides[1]
        .connections
        .pop_first()
        .expect("the server's connection");
    let mut state = LinkState::new(connection);
    for &id in &ids {
        state.streams.insert(id, StreamSlot::default());
    }
    (state, ids, pair.now)
}

/// What the driver does when the core reports data for a stream whose reader waits.
fn data_arrives(state: &mut LinkState, id: StreamId, reader: &Arc<Reader>, now: Instant) {
    let slot = state.streams.get_mut(&id).expect("the stream has a slot");
    slot.reader = Some(Waker::from(reader.clone()));
    state.deferred.push(id);
    state.dispatch_events(now);
}

#[test]
fn a_reader_is_woken_at_once_after_a_quiet_spell_then_at_most_once_per_read_delay() {
    let (mut state, id, reader, start) = receiving(1_000, 200_000, 40 * MAX_READ_DELAY);

    data_arrives(&mut state, id, &reader, start);
    assert_eq!(
        reader.woken(),
        1,
        "the first data after a quiet spell wakes at once"
    );
    assert_eq!(state.wake_readers_at, None);

    let soon = start + Duration::from_micros(100);
    data_arrives(&mut state, id, &reader, soon);
    assert_eq!(reader.woken(), 1, "more data within the delay waits");
    assert_eq!(state.wake_readers_at, Some(start + MAX_READ_DELAY));

    state.dispatch_events(start + MAX_READ_DELAY - Duration::from_micros(1));
    assert_eq!(reader.woken(), 1);
    state.dispatch_events(start + MAX_READ_DELAY);
    assert_eq!(reader.woken(), 2, "the deferred reader is woken when due");
    assert!(state.deferred.is_empty());
    assert_eq!(state.wake_readers_at, None);

    // A reader that stopped waiting (it is reading) is not woken later.
    data_arrives(&mut state, id, &reader, start + MAX_READ_DELAY * 3 / 2);
    state.streams.get_mut(&id).expect("slot").reader = None;
    state.dispatch_events(start + MAX_READ_DELAY * 3);
    assert_eq!(reader.woken(), 2);
    assert!(state.deferred.is_empty());
}

/// Flows that stream side by side, their readers woken at different phases, fall into
/// step: when one reader is due, every other that has waited half its delay is woken with
/// it, and from then on they are woken together. None is woken later than its own delay.
#[test]
fn readers_of_flows_streaming_side_by_side_are_woken_together() {
    let (mut state, ids, start) = receiving_streams(3, 1_000, 50_000, 40 * MAX_READ_DELAY);
    let readers: Vec<Arc<Reader>> = ids.iter().map(|_| Arc::new(Reader::default())).collect();
    let woken = |readers: &[Arc<Reader>]| readers.iter().map(|r| r.woken()).collect::<Vec<_>>();
    // Each flow's first data, after a quiet spell, wakes its reader at once: at 0, at a
    // quarter of the delay and at three quarters.
    let phases = [Duration::ZERO, MAX_READ_DELAY / 4, MAX_READ_DELAY * 3 / 4];
    for ((&id, reader), phase) in ids.iter().zip(&readers).zip(phases) {
        data_arrives(&mut state, id, reader, start + phase);
    }
    assert_eq!(woken(&readers), [1, 1, 1]);
    // More data for all three soon after: each waits for its own delay.
    let soon = start + MAX_READ_DELAY * 4 / 5;
    for (&id, reader) in ids.iter().zip(&readers) {
        data_arrives(&mut state, id, reader, soon);
    }
    assert_eq!(woken(&readers), [1, 1, 1]);
    assert_eq!(state.wake_readers_at, Some(start + MAX_READ_DELAY));
    // The first is due: the second (woken 3/4 of a delay ago) joins it; the third (1/4
    // ago) stays deferred to its own time.
    state.dispatch_events(start + MAX_READ_DELAY);
    assert_eq!(woken(&readers), [2, 2, 1]);
    assert_eq!(
        state.wake_readers_at,
        Some(start + MAX_READ_DELAY * 7 / 4),
        "the third keeps its own time"
    );
    // Data for all three again: at the third's time, the first two (woken 3/4 of a delay
    // before) join it. From here they go in step.
    let later = start + MAX_READ_DELAY * 3 / 2;
    for (&id, reader) in ids.iter().zip(&readers) {
        data_arrives(&mut state, id, reader, later);
    }
    assert_eq!(woken(&readers), [2, 2, 1]);
    assert_eq!(state.wake_readers_at, Some(start + MAX_READ_DELAY * 7 / 4));
    state.dispatch_events(start + MAX_READ_DELAY * 7 / 4);
    assert_eq!(woken(&readers), [3, 3, 2], "all woken together");
    let together = start + MAX_READ_DELAY * 7 / 4;
    for (&id, reader) in ids.iter().zip(&readers) {
        data_arrives(
            &mut state,
            id,
            reader,
            together + Duration::from_micros(100),
        );
    }
    assert_eq!(state.wake_readers_at, Some(together + MAX_READ_DELAY));
    state.dispatch_events(together + MAX_READ_DELAY);
    assert_eq!(woken(&readers), [4, 4, 3]);
}

#[test]
fn enough_waiting_data_wakes_a_reader_without_delay() {
    let (mut state, id, reader, start) =
        receiving(READ_LOW_WATER, 4 * READ_LOW_WATER, 40 * MAX_READ_DELAY);
    data_arrives(&mut state, id, &reader, start);
    data_arrives(&mut state, id, &reader, start + Duration::from_micros(10));
    assert_eq!(reader.woken(), 2);
    assert!(state.deferred.is_empty());
}

/// A short path does not shorten a streaming reader's delay (its data is not what anyone
/// waits for), only a pushed tail's: RTT/8 there, under the 1 ms of longer paths.
#[test]
fn on_a_short_path_only_the_pushed_tail_is_woken_sooner() {
    let rtt = Duration::from_millis(4);
    let (mut state, id, reader, start) = receiving(1_000, 200_000, rtt);
    data_arrives(&mut state, id, &reader, start);
    data_arrives(&mut state, id, &reader, start + Duration::from_micros(10));
    assert_eq!(state.wake_readers_at, Some(start + MAX_READ_DELAY));
    let (mut state, id, reader, start) = receiving(30_000, 30_000, rtt);
    data_arrives(&mut state, id, &reader, start);
    data_arrives(&mut state, id, &reader, start + Duration::from_micros(10));
    let delay = state.connection.rtt().smoothed() / 8;
    assert!(delay < MAX_PUSH_DELAY);
    assert_eq!(state.wake_readers_at, Some(start + delay));
}

/// A connection lets its arrivals wait an eighth of its RTT, at most 2 ms, and not at all
/// before it has an RTT sample or where the hold would be too short to batch anything.
#[test]
fn a_connection_allows_a_hold_of_an_eighth_of_its_rtt() {
    let hold = |ms: u64| {
        let mut rtt = RttEstimator::new(Duration::from_millis(ms));
        rtt.update(Duration::from_millis(ms), Duration::ZERO);
        receive_hold(&rtt)
    };
    assert_eq!(hold(100), MAX_RECEIVE_HOLD);
    assert_eq!(hold(16), MAX_RECEIVE_HOLD);
    assert_eq!(hold(8), Duration::from_millis(1));
    assert_eq!(hold(4), Duration::from_micros(500));
    assert_eq!(hold(1), Duration::from_micros(125));
    assert_eq!(hold(0), Duration::ZERO);
    assert_eq!(
        receive_hold(&RttEstimator::new(Duration::from_millis(100))),
        Duration::ZERO
    );
}

/// The end of what the sender had written (a PUSH) wakes a reader after the shorter delay:
/// the tail of an answer is not held back as long as a streaming flow's data is.
#[test]
fn the_end_of_what_the_peer_wrote_wakes_the_reader_sooner() {
    let (mut state, id, reader, start) = receiving(30_000, 30_000, 40 * MAX_READ_DELAY);
    data_arrives(&mut state, id, &reader, start);
    data_arrives(&mut state, id, &reader, start + Duration::from_micros(10));
    assert_eq!(reader.woken(), 1);
    assert!(MAX_PUSH_DELAY < MAX_READ_DELAY);
    assert_eq!(state.wake_readers_at, Some(start + MAX_PUSH_DELAY));
    state.dispatch_events(start + MAX_PUSH_DELAY);
    assert_eq!(reader.woken(), 2);
}

/// Stops a hung test; nothing asserts on how long anything took.
const HANG: Duration = Duration::from_secs(120);

fn endpoint(secret: &SecretKey, peers: &[&SecretKey]) -> Driver {
    let peers = peers.iter().map(|s| s.public_key()).collect();
    let config = EndpointConfig::new(secret.clone(), peers, fastrand::u64(..));
    Driver::bind((Ipv4Addr::LOCALHOST, 0).into(), config).expect("bind")
}

/// A tunnel from `a` to `b` (whose key is `kb`), established on both sides: (a's, b's).
async fn tunnel(a: &Driver, b: &Driver, kb: &SecretKey) -> (Tunnel, Tunnel) {
    let ours = a.connect(b.local_addr(), kb.public_key()).expect("connect");
    let theirs = tokio::time::timeout(HANG, b.accept()).await.expect("hung");
    let theirs = theirs.expect("accepted");
    for t in [&ours, &theirs] {
        tokio::time::timeout(HANG, t.established())
            .await
            .expect("hung")
            .expect("handshake");
    }
    (ours, theirs)
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut data);
    data
}

fn meta() -> StreamMeta {
    StreamMeta {
        destination: Some(Target::Addr(([192, 0, 2, 1], 80).into())),
        ..StreamMeta::default()
    }
}

/// Sends `data` on a new stream of `from` and reads it whole from `to`, where it arrives.
async fn carry(from: &Tunnel, to: &Tunnel, data: &[u8]) -> Vec<u8> {
    let mut sending = from.open(meta()).expect("a stream");
    let send = async {
        sending.write_all(data).await.expect("write");
        sending.shutdown().await.expect("finish");
    };
    let receive = async {
        let mut stream = to.accept_stream().await.expect("the stream");
        let mut received = Vec::new();
        stream.read_to_end(&mut received).await.expect("read");
        received
    };
    let ((), received) = tokio::time::timeout(HANG, async { tokio::join!(send, receive) })
        .await
        .expect("transfer hung");
    received
}

/// A send that finds the socket's buffer full used to make the I/O task wait for room,
/// with every connection's receiving and acknowledging stopped behind it. Now the transmit
/// is parked with its connection: here sends from `a` to `b` are held back as if the
/// buffer were full for them, and meanwhile `a` still receives what `b` sends and carries a
/// whole transfer each way with `c`; once they are let through, the parked transmit leaves
/// and the transfer with `b` completes. (Held sends leave the socket writable, unlike a real
/// full buffer; watching the socket for room is not exercised here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_socket_toward_one_peer_leaves_receiving_and_the_other_peers_served() {
    let (ka, kb, kc) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    let a = endpoint(&ka, &[&kb, &kc]);
    let b = endpoint(&kb, &[&ka]);
    let c = endpoint(&kc, &[&ka]);
    let (a_to_b, b_to_a) = tunnel(&a, &b, &kb).await;
    let (a_to_c, c_to_a) = tunnel(&a, &c, &kc).await;
    a.shared
        .blocked
        .lock()
        .expect("not poisoned")
        .push(b.local_addr());

    // b's first flight reaches a's application though a can acknowledge none of it.
    let from_b = bytes(1, 400_000);
    let mut b_stream = b_to_a.open(meta()).expect("a stream");
    let b_writes = {
        let data = from_b.clone();
        tokio::spawn(async move {
            b_stream.write_all(&data).await.expect("write");
            b_stream.shutdown().await.expect("finish");
            b_stream
        })
    };
    let mut at_a = tokio::time::timeout(HANG, a_to_b.accept_stream())
        .await
        .expect("hung")
        .expect("b's stream");
    let mut first = vec![0u8; 8_000];
    tokio::time::timeout(HANG, at_a.read_exact(&mut first))
        .await
        .expect("a stopped receiving while its socket was full toward b")
        .expect("read");
    assert_eq!(first, from_b[..first.len()]);

    // The other peer is served both ways meanwhile.
    let to_c = bytes(2, 1_000_000);
    assert_eq!(carry(&a_to_c, &c_to_a, &to_c).await, to_c);
    let from_c = bytes(3, 1_000_000);
    assert_eq!(carry(&c_to_a, &a_to_c, &from_c).await, from_c);
    assert!(a_to_b.error().is_none() && b_to_a.error().is_none());

    // Room again: what was parked leaves, and b's transfer completes.
    a.shared.blocked.lock().expect("not poisoned").clear();
    let mut rest = Vec::new();
    tokio::time::timeout(HANG, at_a.read_to_end(&mut rest))
        .await
        .expect("b's transfer hung after the socket had room")
        .expect("read");
    first.extend_from_slice(&rest);
    assert_eq!(first, from_b);
    tokio::time::timeout(HANG, b_writes)
        .await
        .expect("hung")
        .expect("b's writer");
}

/// Plays arrivals at the given offsets (µs from an epoch, sorted) through [`Moderation`] as
/// the I/O task does: watching, an arrival is taken when it comes (with any others due by
/// then); holding, everything that came is taken when the hold ends. With `racing`, the
/// first arrival after each hold begins is reported anyway, as one that came before the
/// socket was unwatched would be. Returns, per arrival, how long it waited, and the number
/// of receives made (the task's wake-ups for arrivals).
fn moderate(arrivals: &[u64], hold: Duration, racing: bool) -> (Vec<Duration>, usize) {
    let epoch = crate::test_epoch();
    let at = |us: u64| epoch + Duration::from_micros(us);
    let mut moderation = Moderation {
        cap: hold,
        ..Moderation::default()
    };
    let mut waits = Vec::new();
    let mut receives = 0;
    let mut next = 0;
    let mut raced = None;
    while next < arrivals.len() {
        // When the task next receives: at the end of a hold (or at an arrival that raced
        // its start), or at the next arrival.
        let now = match moderation.until {
            Some(until) if racing && raced != Some(until) && at(arrivals[next]) < until => {
                raced = Some(until);
                at(arrivals[next])
            }
            Some(until) => until,
            None => at(arrivals[next]),
        };
        let taken = arrivals[next..]
            .iter()
            .take_while(|&&a| at(a) <= now)
            .count();
        waits.extend(arrivals[next..next + taken].iter().map(|&a| now - at(a)));
        next += taken;
        receives += 1;
        moderation.received(now, taken as u64);
    }
    (waits, receives)
}

/// A lone request is taken when it arrives; so is the first datagram of a stream, and the
/// second, which shows the stream; from then on they are taken a batch at a time, until a
/// hold ends with fewer than two waiting.
#[test]
fn streamed_arrivals_are_taken_a_batch_at_a_time() {
    let cap = MAX_RECEIVE_HOLD;
    let batch = RECEIVE_BATCH as usize;
    let (waits, receives) = moderate(&[0], cap, false);
    assert_eq!((waits, receives), (vec![Duration::ZERO], 1));
    // 100 Mbit/s of 1,472-byte datagrams: one every ~118 µs, for 10 ms.
    let stream: Vec<u64> = (0..85).map(|i| i * 118).collect();
    let (waits, receives) = moderate(&stream, cap, false);
    assert_eq!(&waits[..2], &[Duration::ZERO, Duration::ZERO]);
    assert!(waits.iter().all(|&w| w <= cap), "{waits:?}");
    // Two wake-ups to see the stream, then one per batch of arrivals (and one that finds
    // the stream over).
    assert!(
        receives <= 2 + 85 / (batch - 1) + 1,
        "{receives} receives for 85 datagrams"
    );
    // A 64 KiB answer at 500 Mbit/s: 45 datagrams 23 µs apart. Its tail waits about as long
    // as a batch's arrivals take, not the longest hold.
    let burst: Vec<u64> = (0..45).map(|i| i * 23).collect();
    let (waits, receives) = moderate(&burst, cap, false);
    let longest = waits.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= Duration::from_micros(23 * (u64::from(RECEIVE_BATCH) + 1)),
        "{waits:?}"
    );
    assert!(
        receives <= 2 + 45 / (batch - 1) + 1,
        "{receives} receives for 45 datagrams"
    );
    // Arrivals a hold or more apart are each taken at once.
    let sparse: Vec<u64> = (0..20).map(|i| i * 2_500).collect();
    let (waits, receives) = moderate(&sparse, cap, false);
    assert!(waits.iter().all(Duration::is_zero), "{waits:?}");
    assert_eq!(receives, 20);
    // Without an RTT to size it, there is no hold.
    let (waits, receives) = moderate(&stream, Duration::ZERO, false);
    assert!(waits.iter().all(Duration::is_zero));
    assert_eq!(receives, 85);
}

/// A wake-up during a hold that finds nothing or one datagram (room to send, a socket
/// error, a report that raced the hold) leaves the hold as it was; a straggler at its end
/// does not start another; a connection that allows less cuts a hold under way.
#[test]
fn a_hold_ends_when_it_should() {
    let cap = Duration::from_millis(1);
    let t0 = crate::test_epoch();
    let us = |n: u64| t0 + Duration::from_micros(n);
    let mut moderation = Moderation {
        cap,
        ..Moderation::default()
    };
    // Arrivals 50 µs apart: a batch of them takes 800 µs, within the cap.
    let end = 50 + 50 * u64::from(RECEIVE_BATCH);
    assert!(Duration::from_micros(end - 50) < cap);
    moderation.received(us(0), 1);
    moderation.received(us(50), 1);
    assert_eq!(
        moderation.until,
        Some(us(end)),
        "a batch's arrivals at 50 µs, from 50"
    );
    moderation.received(us(300), 0);
    assert_eq!(
        moderation.until,
        Some(us(end)),
        "an empty wake-up keeps the hold"
    );
    moderation.received(us(400), 1);
    assert_eq!(moderation.until, Some(us(end)), "so does one datagram");
    assert_eq!(
        moderation.last,
        Some(us(400)),
        "the pace is counted from it"
    );
    moderation.received(us(end), 1);
    assert_eq!(
        moderation.until, None,
        "one straggler at the end: watching again"
    );
    moderation.received(us(5_000), 2);
    assert_eq!(
        moderation.until,
        Some(us(6_000)),
        "two after a quiet spell: the longest hold"
    );
    moderation.set_cap(Duration::from_micros(200), us(5_100));
    assert_eq!(
        moderation.until,
        Some(us(5_200)),
        "cut to the new longest hold"
    );
    moderation.set_cap(Duration::from_micros(100), us(5_100));
    assert_eq!(
        moderation.until, None,
        "cut to the past: over, watching again"
    );
    // Arrivals so close that a batch of them takes less than the shortest hold: not worth
    // a timer.
    let gap = (MIN_RECEIVE_HOLD / RECEIVE_BATCH).as_micros() as u64 - 1;
    moderation.set_cap(cap, us(10_000));
    moderation.received(us(10_000), 1);
    moderation.received(us(10_000 + gap), 1);
    assert_eq!(moderation.until, None);
    // Receives that keep failing are tried again after the longest hold.
    // The I/O task sets the connections' cap right after; with no datagram for 10 ms
    // that cap would have ended an ordinary hold.
    moderation.back_off(us(20_000));
    moderation.set_cap(cap, us(20_000));
    let again = us(20_000) + MAX_RECEIVE_HOLD;
    assert!(!moderation.is_over(again - Duration::from_micros(1)));
    assert!(moderation.is_over(again));
}

proptest::proptest! {
    /// Whatever the arrivals, and whether or not one races each hold's start: none waits
    /// longer than the longest hold, and each receive that finds nothing ends a hold begun
    /// by one that found something.
    #[test]
    fn no_arrival_waits_longer_than_a_hold(
        gaps in proptest::collection::vec(0u64..3_000, 1..300),
        hold_us in 0u64..2_000,
        racing: bool,
    ) {
        let arrivals: Vec<u64> = gaps
            .iter()
            .scan(0, |t, g| {
                *t += g;
                Some(*t)
            })
            .collect();
        let hold = Duration::from_micros(hold_us);
        let (waits, receives) = moderate(&arrivals, hold, racing);
        proptest::prop_assert_eq!(waits.len(), arrivals.len());
        proptest::prop_assert!(waits.iter().all(|&w| w <= hold), "{:?}", waits);
        proptest::prop_assert!(receives <= 2 * arrivals.len());
    }

    /// Datagrams streaming in at any pace that brings eight within the longest hold, and
    /// slow enough that eight take longer than the shortest, are taken in batches: a
    /// handful of receives to see the stream and to find it over, then one per six
    /// arrivals at most; one per three when an arrival races each hold's start.
    #[test]
    fn a_stream_is_taken_in_batches(
        pace_us in 7u64..=125,
        count in 16usize..500,
        racing: bool,
    ) {
        let arrivals: Vec<u64> = (0..count as u64).map(|i| i * pace_us).collect();
        let (waits, receives) = moderate(&arrivals, Duration::from_millis(1), racing);
        proptest::prop_assert!(waits.iter().all(|&w| w <= Duration::from_millis(1)));
        let most = if racing { 3 + count / 3 } else { 3 + count / 6 };
        proptest::prop_assert!(
            receives <= most,
            "{} receives for {} arrivals {} µs apart", receives, count, pace_us
        );
    }
}

//! Recovery alone, frame by frame: packets sent, ACK frames in, what is acknowledged and
//! lost out.

use super::*;
use crate::range_set::RangeSet;

const MS: Duration = Duration::from_millis(1);

/// Records what recovery says of each frame.
#[derive(Debug, Default)]
struct Outcomes {
    acked: Vec<SentFrame>,
    lost: Vec<SentFrame>,
}

impl FrameOutcome for Outcomes {
    fn on_acked(&mut self, frame: SentFrame) {
        self.acked.push(frame);
    }
    fn on_lost(&mut self, frame: SentFrame) {
        self.lost.push(frame);
    }
}

/// A path MTU search that settled at 1,400 bytes.
fn settled_mtu(now: Instant) -> PathMtu {
    let mut mtu = PathMtu::new(1400, false);
    mtu.start(now);
    while let Some(size) = mtu.probe_due(now) {
        mtu.on_probe_sent(size);
        mtu.on_probe_acked(now, size);
    }
    assert_eq!(mtu.current(), 1400);
    mtu
}

fn started(now: Instant) -> Recovery {
    let mut r = Recovery::new(now, 25 * MS, settled_mtu(now));
    let params = PathParams {
        max_datagram: 1400,
        initial_rtt: INITIAL_RTT,
        peer_ack_delay: 25 * MS,
        hint: None,
    };
    r.start(now, &CongestionControl::default(), params);
    r
}

/// Sends one 1,400-byte packet carrying control message `seq`.
fn send(r: &mut Recovery, now: Instant, seq: u64) {
    r.on_packet_sent(
        now,
        1400,
        true,
        smallvec::smallvec![SentFrame::Control(seq)],
    );
}

fn ack(pns: &[u64], delay_us: u64) -> Ack {
    let mut set = RangeSet::new();
    for &pn in pns {
        set.insert(pn..pn + 1);
    }
    Ack::acknowledging(set.iter(), delay_us, 1000).unwrap()
}

#[test]
fn an_ack_frees_its_packets_and_reports_their_frames() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    for seq in 0..3 {
        send(&mut r, t0, seq);
    }
    assert_eq!(r.in_flight(), 3 * 1400);
    r.on_ack_frame(t0 + 100 * MS, &ack(&[0, 1, 2], 0), &mut out)
        .unwrap();
    let expected: Vec<_> = (0..3).map(SentFrame::Control).collect();
    assert_eq!(out.acked, expected);
    assert!(out.lost.is_empty());
    assert_eq!(r.in_flight(), 0);
    assert_eq!(r.rtt().latest(), 100 * MS);
    assert_eq!(r.loss_detection_deadline(), None, "nothing in flight");
}

#[test]
fn three_later_packets_acknowledged_declare_a_packet_lost() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    for seq in 0..5 {
        send(&mut r, t0, seq);
    }
    // Packets 1-3 acknowledged: 0 is not yet three below the largest.
    r.on_ack_frame(t0 + 100 * MS, &ack(&[1, 2], 0), &mut out)
        .unwrap();
    assert!(out.lost.is_empty());
    let deadline = r.loss_detection_deadline().expect("a time threshold");
    assert_eq!(deadline, t0 + 100 * MS * 9 / 8);
    r.on_ack_frame(t0 + 101 * MS, &ack(&[3], 0), &mut out)
        .unwrap();
    assert_eq!(out.lost, [SentFrame::Control(0)]);
    assert_eq!(r.stats().packets_lost, 1);
    assert_eq!(r.in_flight(), 1400, "packet 4 is still in flight");
}

#[test]
fn a_packet_is_lost_by_time_when_the_timer_fires() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    send(&mut r, t0, 0);
    send(&mut r, t0 + MS, 1);
    r.on_ack_frame(t0 + 100 * MS, &ack(&[1], 0), &mut out)
        .unwrap();
    let at = r.loss_detection_deadline().unwrap();
    assert_eq!(r.on_timeout(at, at, &mut out), Timeout::Detected);
    assert_eq!(out.lost, [SentFrame::Control(0)]);
}

#[test]
fn an_unanswered_tail_gets_probes_and_backs_off() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    send(&mut r, t0, 0);
    let first = r.loss_detection_deadline().unwrap();
    assert_eq!(r.on_timeout(first, t0, &mut out), Timeout::Probe);
    assert_eq!(r.probes(), 2);
    r.on_probes_sent(2);
    let second = r.loss_detection_deadline().unwrap();
    assert_eq!(second - t0, (first - t0) * 2, "exponential backoff");
    assert!(out.lost.is_empty(), "a probe timeout declares nothing lost");
}

#[test]
fn an_ack_of_an_unsent_packet_is_a_violation() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    send(&mut r, t0, 0);
    let e = r
        .on_ack_frame(t0, &ack(&[1], 0), &mut Outcomes::default())
        .unwrap_err();
    assert_eq!(e.frame, Some(ACK));
    assert!(r.on_recovered_frame(&ack(&[5], 0)).is_err());
}

fn black_holes(r: &Recovery) -> u64 {
    r.mtu.stats().black_holes
}

#[test]
fn full_size_packets_vanishing_while_small_ones_get_through_is_a_black_hole() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    // Small packets get through; none of the large ones does.
    for i in 0..BLACK_HOLE_PACKETS {
        let now = t0 + MS * i;
        r.on_packet_sent(now, 1400, true, FrameList::new());
        r.on_packet_sent(
            now,
            100,
            true,
            smallvec::smallvec![SentFrame::Stream(StreamFrameSent::MaxData)],
        );
    }
    let small: Vec<u64> = (0..u64::from(BLACK_HOLE_PACKETS))
        .map(|i| 2 * i + 1)
        .collect();
    r.on_ack_frame(t0 + 50 * MS, &ack(&small, 0), &mut out)
        .unwrap();
    assert_eq!(black_holes(&r), 1);
    assert_eq!(r.mtu.current(), BASE_DATAGRAM);
    // The large packets, lost once the time threshold passes, are not congestion.
    let before = r.controller_state().map(|c| c.losses);
    r.on_timeout(t0 + 500 * MS, t0 + 500 * MS, &mut out);
    assert_eq!(r.stats().packets_lost, u64::from(BLACK_HOLE_PACKETS));
    assert_eq!(r.controller_state().map(|c| c.losses), before);
}

#[test]
fn a_few_full_size_packets_lost_before_a_small_one_are_not_a_black_hole() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    for i in 0..BLACK_HOLE_PACKETS - 1 {
        r.on_packet_sent(t0 + MS * i, 1400, true, FrameList::new());
    }
    r.on_packet_sent(t0 + 10 * MS, 100, true, FrameList::new());
    let small = u64::from(BLACK_HOLE_PACKETS - 1);
    r.on_ack_frame(t0 + 50 * MS, &ack(&[small], 0), &mut out)
        .unwrap();
    assert_eq!(black_holes(&r), 0);
    assert_eq!(r.mtu.current(), 1400);
}

#[test]
fn full_size_packets_unanswered_while_the_peer_is_heard_is_a_black_hole() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    for i in 0..BLACK_HOLE_PACKETS {
        r.on_packet_sent(t0 + MS * i, 1400, true, FrameList::new());
    }
    let early = t0 + BLACK_HOLE_AFTER - MS;
    r.on_timeout(early, early, &mut out);
    assert_eq!(black_holes(&r), 0);
    let late = t0 + BLACK_HOLE_AFTER;
    // Unless the peer itself went quiet: then it is silence, not a black hole.
    r.on_timeout(late, t0, &mut out);
    assert_eq!(black_holes(&r), 0);
    r.on_timeout(late, late, &mut out);
    assert_eq!(black_holes(&r), 1);
}

#[test]
fn full_size_packets_lost_in_an_outage_are_not_a_black_hole() {
    let t0 = crate::test_epoch();
    let mut r = started(t0);
    let mut out = Outcomes::default();
    for i in 0..BLACK_HOLE_PACKETS {
        r.on_packet_sent(t0 + MS * i, 1400, true, FrameList::new());
    }
    // Nothing heard for five seconds; then the link is back and the peer with it.
    let back = t0 + 5 * BLACK_HOLE_AFTER / 3;
    r.on_peer_back(back);
    r.on_timeout(back, back, &mut out);
    assert_eq!(black_holes(&r), 0);
    // The window starts again: only full-size packets vanishing from now on count.
    for i in 0..BLACK_HOLE_PACKETS {
        r.on_packet_sent(back + MS * i, 1400, true, FrameList::new());
    }
    let late = back + BLACK_HOLE_AFTER;
    r.on_timeout(late, late, &mut out);
    assert_eq!(black_holes(&r), 1);
}

#[test]
fn a_lost_mtu_probe_is_neither_congestion_nor_a_loss_of_the_line() {
    let t0 = crate::test_epoch();
    let mut r = Recovery::new(t0, 25 * MS, PathMtu::new(9000, false));
    let params = PathParams {
        max_datagram: 1200,
        initial_rtt: INITIAL_RTT,
        peer_ack_delay: 25 * MS,
        hint: None,
    };
    r.start(t0, &CongestionControl::default(), params);
    r.mtu.start(t0);
    let mut out = Outcomes::default();
    let size = r.mtu.probe_due(t0).unwrap();
    r.on_mtu_probe_sent(t0, usize::from(size));
    assert_eq!(r.in_flight(), 0, "probes do not count in flight");
    for seq in 0..4 {
        r.on_packet_sent(
            t0 + MS,
            1200,
            true,
            smallvec::smallvec![SentFrame::Control(seq)],
        );
    }
    r.on_ack_frame(t0 + 100 * MS, &ack(&[1, 2, 3, 4], 0), &mut out)
        .unwrap();
    assert_eq!(r.in_flight(), 0);
    assert_eq!(r.mtu.stats().probes_sent, 1);
    assert_eq!(r.stats().packets_lost, 0);
    assert_eq!(r.controller_state().map(|c| c.losses), Some(0));
    assert!(out.lost.is_empty());
    assert_eq!(r.mtu.current(), BASE_DATAGRAM);
}

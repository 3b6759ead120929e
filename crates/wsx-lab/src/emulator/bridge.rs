//! The emulator process: an `AF_PACKET` bridge between the two wan-side interfaces of the `wan`
//! namespace that runs every frame through the [`Link`] model of its direction.
//!
//! One thread forwards; a second serves the control socket. The forwarding loop:
//! 1. sends every held frame whose departure time has come, in `sendmmsg` batches;
//! 2. receives what is waiting on each interface with `recvmmsg` into pooled buffers and asks the
//!    link model for each frame's fate (drop, or a departure time pushed on a min-heap);
//! 3. sleeps in `ppoll` until the next departure, a frame, or a control request.
//!
//! Buffers come from a pool that grows to the high-water mark of frames held and is reused, so
//! forwarding allocates nothing per packet. The loop reads the clock once per batch; the
//! per-millisecond timeline uses each frame's kernel receive timestamp instead.

use super::control::{Direction, EmulatorConfig, Request, Response};
use super::model::{DropReason, Link, Verdict};
use super::stats::{Counter, Counters, EmulatorStats, LATE_NS, Timeline};
use crate::sys::{self, EventFd, MsgBatch, PacketSocket};
use anyhow::{Context, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

/// Room for one Ethernet frame of a 1500-byte MTU (1514 bytes) plus a VLAN tag, rounded up.
/// Larger frames mean a segmentation offload was left on: they are counted as faults.
const SLOT_BYTES: usize = 2048;
/// Frames per `recvmmsg`/`sendmmsg` call.
const BATCH: usize = 64;
/// Receive batches per interface before the loop sends again, so heavy input cannot delay
/// departures by more than a few hundred microseconds.
const RX_BATCHES_PER_TURN: usize = 4;
/// At most this many frames held at once (256 MiB of buffers): beyond it frames are faults.
const MAX_SLOTS: usize = 131_072;
/// Socket buffers: a 64 MiB receive buffer absorbs ~40,000 frames while the loop is busy.
const SOCKET_BUFFER: usize = 64 << 20;
/// How often the kernel's per-socket drop counters are read.
const KERNEL_DROPS_EVERY_NS: u64 = 50_000_000;
/// The Ethernet header the rate does not count (rates are in IP bytes).
const ETHERNET_HEADER: usize = 14;

/// Runs the emulator until the process is killed.
pub fn run(a_iface: &str, b_iface: &str, control: &Path, config: EmulatorConfig) -> Result<()> {
    config.validate()?;
    sys::precise_timers().context("setting timer slack")?;
    let sockets = [
        PacketSocket::bind(a_iface, SOCKET_BUFFER)
            .with_context(|| format!("packet socket on {a_iface}"))?,
        PacketSocket::bind(b_iface, SOCKET_BUFFER)
            .with_context(|| format!("packet socket on {b_iface}"))?,
    ];
    let shared = Arc::new(Shared {
        counters: [Counters::default(), Counters::default()],
        timelines: [Timeline::default(), Timeline::default()],
        buffers: AtomicU64::new(0),
        config: Mutex::new(config.clone()),
        wake: EventFd::new()?,
    });
    let (changes_tx, changes) = mpsc::channel();
    let _ = std::fs::remove_file(control);
    let listener =
        UnixListener::bind(control).with_context(|| format!("binding {}", control.display()))?;
    let control_shared = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || serve_control(listener, &control_shared, &changes_tx))?;

    let mut forwarder = Forwarder {
        links: [
            Link::new(config.a_to_b, config.seed),
            Link::new(
                config.b_to_a,
                config.seed.wrapping_add(0x9e37_79b9_7f4a_7c15),
            ),
        ],
        heaps: [BinaryHeap::new(), BinaryHeap::new()],
        pool: Pool::default(),
        batch: MsgBatch::new(BATCH),
        rx_slots: Vec::with_capacity(BATCH),
        rx_result: Vec::with_capacity(BATCH),
        tx: Vec::with_capacity(BATCH),
        sequence: 0,
    };
    forwarder.run(&shared, &sockets, &changes)
}

struct Shared {
    counters: [Counters; 2],
    timelines: [Timeline; 2],
    buffers: AtomicU64,
    config: Mutex<EmulatorConfig>,
    wake: EventFd,
}

/// A frame waiting for its departure: (departure ns, arrival sequence, slot, length).
type Held = Reverse<(u64, u64, u32, u16)>;

struct Forwarder {
    /// Index 0 carries frames from interface a to b, index 1 from b to a.
    links: [Link; 2],
    heaps: [BinaryHeap<Held>; 2],
    pool: Pool,
    batch: MsgBatch,
    rx_slots: Vec<u32>,
    rx_result: Vec<(usize, bool, Option<u64>)>,
    /// Frames of the batch being sent: (slot, frame length, due time).
    tx: Vec<(u32, usize, u64)>,
    sequence: u64,
}

impl Forwarder {
    fn run(
        &mut self,
        shared: &Shared,
        sockets: &[PacketSocket; 2],
        changes: &mpsc::Receiver<(Direction, super::LinkParams)>,
    ) -> Result<()> {
        let fds = [
            sockets[0].as_raw_fd(),
            sockets[1].as_raw_fd(),
            shared.wake.as_raw_fd(),
        ];
        let mut ready = [true, true, false];
        let mut next_kernel_check = 0;
        loop {
            let now = sys::monotonic_ns();
            for dir in 0..2 {
                self.send_due(dir, now, &sockets[1 - dir], &shared.counters[dir])?;
            }
            if ready[2] {
                shared.wake.drain();
                while let Ok((direction, params)) = changes.try_recv() {
                    for &dir in directions(direction) {
                        self.links[dir].set_params(params.clone());
                    }
                }
            }
            for dir in 0..2 {
                if ready[dir] {
                    self.receive(dir, &sockets[dir], shared)?;
                }
            }
            if now >= next_kernel_check {
                next_kernel_check = now + KERNEL_DROPS_EVERY_NS;
                for (socket, counters) in sockets.iter().zip(&shared.counters) {
                    counters.add(Counter::EmulatorFaults, socket.take_kernel_drops()?);
                }
            }
            let next = self
                .heaps
                .iter()
                .filter_map(|h| h.peek().map(|Reverse(e)| e.0))
                .min();
            let now = sys::monotonic_ns();
            let timeout = next.map(|at| at.saturating_sub(now));
            // The kernel-drop check needs a turn now and then, even when idle.
            let timeout = Some(
                timeout
                    .unwrap_or(KERNEL_DROPS_EVERY_NS)
                    .min(KERNEL_DROPS_EVERY_NS),
            );
            if timeout != Some(0) {
                sys::wait_readable(&fds, timeout, &mut ready).context("ppoll")?;
            } else {
                ready = [true, true, false];
            }
        }
    }

    fn receive(&mut self, dir: usize, socket: &PacketSocket, shared: &Shared) -> Result<()> {
        let counters = &shared.counters[dir];
        for _ in 0..RX_BATCHES_PER_TURN {
            self.rx_slots.clear();
            while self.rx_slots.len() < self.batch.capacity() {
                match self.pool.take() {
                    Some(slot) => self.rx_slots.push(slot),
                    None => break,
                }
            }
            shared
                .buffers
                .store(self.pool.allocated() as u64, Ordering::Relaxed);
            if self.rx_slots.is_empty() {
                // Pool exhausted: leave frames in the socket; the kernel drops and counts them.
                return Ok(());
            }
            let pool = &mut self.pool;
            let mut bufs = self.rx_slots.iter().map(|&s| (pool.ptr(s), SLOT_BYTES));
            // SAFETY: each slot is a live SLOT_BYTES buffer owned by the pool and not aliased:
            // the slots were just taken from the free list.
            let n = unsafe { self.batch.recv(socket, &mut bufs, &mut self.rx_result)? };
            let now = sys::monotonic_ns();
            // The kernel stamps frames on the real-time clock.
            let real_minus_monotonic = sys::realtime_ns().wrapping_sub(now);
            for i in 0..n {
                let slot = self.rx_slots[i];
                let (len, truncated, kernel_ns) = self.rx_result[i];
                if truncated || !(ETHERNET_HEADER..=SLOT_BYTES).contains(&len) {
                    counters.add(Counter::EmulatorFaults, 1);
                    self.pool.give_back(slot);
                    continue;
                }
                let ip_bytes = (len - ETHERNET_HEADER) as u64;
                counters.add(Counter::RxPkts, 1);
                counters.add(Counter::RxBytes, ip_bytes);
                // The timeline records when the frame reached the emulator's interface
                // (the kernel's stamp), so a batch read late does not look like a burst;
                // the link model works from `now`, as it always has.
                let arrived = kernel_ns
                    .map(|k| k.wrapping_sub(real_minus_monotonic))
                    .filter(|&a| a <= now && now - a < 1_000_000_000)
                    .unwrap_or_else(|| {
                        counters.add(Counter::Unstamped, 1);
                        now
                    });
                shared.timelines[dir].add(arrived, ip_bytes);
                match self.links[dir].handle_packet(now, ip_bytes) {
                    Verdict::Drop(reason) => {
                        let counter = match reason {
                            DropReason::Random => Counter::DropRandom,
                            DropReason::Burst => Counter::DropBurst,
                            DropReason::Queue => Counter::DropQueue,
                            DropReason::TooBig => Counter::DropTooBig,
                        };
                        counters.add(counter, 1);
                        counters.add(Counter::DropBytes, ip_bytes);
                        self.pool.give_back(slot);
                    }
                    Verdict::Deliver {
                        at_ns,
                        duplicate,
                        reordered,
                        queued_ns,
                    } => {
                        counters.add(Counter::Reordered, u64::from(reordered));
                        counters.add_queue_delay(queued_ns);
                        self.hold(dir, at_ns, slot, len);
                        if duplicate {
                            match self.pool.take() {
                                Some(copy) => {
                                    self.pool.copy(slot, copy, len);
                                    counters.add(Counter::Duplicated, 1);
                                    self.hold(dir, at_ns, copy, len);
                                }
                                None => counters.add(Counter::EmulatorFaults, 1),
                            }
                        }
                    }
                }
            }
            for &slot in &self.rx_slots[n..] {
                self.pool.give_back(slot);
            }
            if n < self.rx_slots.len() {
                break;
            }
        }
        Ok(())
    }

    fn hold(&mut self, dir: usize, at_ns: u64, slot: u32, len: usize) {
        self.sequence += 1;
        self.heaps[dir].push(Reverse((at_ns, self.sequence, slot, len as u16)));
    }

    fn send_due(
        &mut self,
        dir: usize,
        now: u64,
        out: &PacketSocket,
        counters: &Counters,
    ) -> Result<()> {
        loop {
            self.tx.clear();
            while self.tx.len() < BATCH {
                match self.heaps[dir].peek() {
                    Some(&Reverse((at, _, slot, len))) if at <= now => {
                        self.tx.push((slot, usize::from(len), at));
                        self.heaps[dir].pop();
                    }
                    _ => break,
                }
            }
            if self.tx.is_empty() {
                return Ok(());
            }
            let pool = &mut self.pool;
            let mut bufs = self.tx.iter().map(|&(slot, len, _)| (pool.ptr(slot), len));
            // SAFETY: each slot is a live pool buffer holding `len` bytes of a received frame.
            let sent = unsafe { self.batch.send(out, &mut bufs)? };
            for (i, &(slot, len, at)) in self.tx.iter().enumerate() {
                if now - at > LATE_NS {
                    counters.add(Counter::ReleasedLate, 1);
                }
                if i < sent {
                    counters.add(Counter::FwdPkts, 1);
                    counters.add(Counter::FwdBytes, (len - ETHERNET_HEADER) as u64);
                } else {
                    counters.add(Counter::EmulatorFaults, 1);
                }
                self.pool.give_back(slot);
            }
            if self.tx.len() < BATCH {
                return Ok(());
            }
        }
    }
}

fn directions(direction: Direction) -> &'static [usize] {
    match direction {
        Direction::AToB => &[0],
        Direction::BToA => &[1],
        Direction::Both => &[0, 1],
    }
}

/// Fixed-size frame buffers, allocated on demand up to [`MAX_SLOTS`] and reused.
#[derive(Default)]
struct Pool {
    /// Boxed so that growing the pool moves pointers, never the 2 KiB frames themselves.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<[u8; SLOT_BYTES]>>,
    free: Vec<u32>,
}

impl Pool {
    fn take(&mut self) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        if self.slots.len() >= MAX_SLOTS {
            return None;
        }
        self.slots.push(Box::new([0; SLOT_BYTES]));
        Some((self.slots.len() - 1) as u32)
    }

    fn give_back(&mut self, slot: u32) {
        self.free.push(slot);
    }

    fn allocated(&self) -> usize {
        self.slots.len()
    }

    fn ptr(&mut self, slot: u32) -> *mut u8 {
        self.slots[slot as usize].as_mut_ptr()
    }

    fn copy(&mut self, from: u32, to: u32, len: usize) {
        let frame = *self.slots[from as usize];
        self.slots[to as usize][..len].copy_from_slice(&frame[..len]);
    }
}

fn serve_control(
    listener: UnixListener,
    shared: &Shared,
    changes: &mpsc::Sender<(Direction, super::LinkParams)>,
) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let answer = answer_one(&stream, shared, changes).unwrap_or_else(|e| Response::Error {
            message: format!("{e:#}"),
        });
        if let Ok(mut line) = serde_json::to_string(&answer) {
            line.push('\n');
            let _ = (&stream).write_all(line.as_bytes());
        }
    }
}

fn answer_one(
    stream: &UnixStream,
    shared: &Shared,
    changes: &mpsc::Sender<(Direction, super::LinkParams)>,
) -> Result<Response> {
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let request: Request = serde_json::from_str(&line).context("malformed request")?;
    Ok(match request {
        Request::MarkTimeline { direction } | Request::Timeline { direction }
            if direction == Direction::Both =>
        {
            Response::Error {
                message: "a timeline is of one direction: a_to_b or b_to_a".into(),
            }
        }
        Request::MarkTimeline { direction } => {
            shared.timelines[usize::from(direction == Direction::BToA)].mark(sys::monotonic_ns());
            Response::Done
        }
        Request::Timeline { direction } => Response::Timeline {
            bytes_per_ms: shared.timelines[usize::from(direction == Direction::BToA)].read(),
        },
        Request::Stats => {
            let usage = sys::process_usage();
            Response::Stats(Box::new(EmulatorStats {
                a_to_b: shared.counters[0].snapshot(),
                b_to_a: shared.counters[1].snapshot(),
                cpu_user_s: usage.user_s,
                cpu_sys_s: usage.sys_s,
                max_rss_kb: usage.max_rss_kb,
                buffers: shared.buffers.load(Ordering::Relaxed),
            }))
        }
        Request::Config => Response::Config(Box::new(
            shared
                .config
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .clone(),
        )),
        Request::Set { direction, params } => {
            if let Err(message) = params.validate() {
                return Ok(Response::Error { message });
            }
            let mut config = shared
                .config
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?;
            for &dir in directions(direction) {
                *(if dir == 0 {
                    &mut config.a_to_b
                } else {
                    &mut config.b_to_a
                }) = params.clone();
            }
            changes
                .send((direction, params))
                .context("forwarder has stopped")?;
            shared.wake.notify();
            Response::Done
        }
    })
}

//! `FastGuest`: the shared frontend ([`super::frontend`]) driven with a data
//! path that costs as little as possible, so that the switch, not the
//! driver, sets the pace (part 2 of the `fabric` bench; the control path is
//! the one `TestGuest` uses):
//!
//! - every descriptor slot owns one fixed 2 KiB buffer, written once: sending
//!   a frame is one avail-ring entry, receiving one is a used-ring read and a
//!   re-post of the same slot; nothing is allocated or logged per frame;
//! - kicks follow `avail_event` (EVENT_IDX) or `VRING_USED_F_NO_NOTIFY`;
//!   calls are asked for only before sleeping, with `used_event` set to wake
//!   us after a burst rather than after every frame (like Linux NAPI);
//! - the driver sleeps in `ppoll(2)` on the call eventfds, never spins.
//!
//! Nothing here is specific to one backend: the daemon and `dpdk-testpmd`'s
//! `net_vhost` ports are driven by exactly this code ([`drive`], [`prime`]).

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use vhost::vhost_user::message::VhostUserProtocolFeatures;

use super::frontend::{feat, Connection, SplitRing, Want, DESC_F_WRITE};
use super::guest::NetHdr;

/// What the fast guest asks for (intersected with the offer): no offloads,
/// no indirect descriptors, one queue pair.
pub const WANT: u64 =
    feat::VERSION_1 | feat::MRG_RXBUF | feat::EVENT_IDX | feat::MAC | feat::STATUS;

/// `struct virtio_net_hdr_mrg_rxbuf` (VERSION_1 layout is always 12 bytes).
const HDR_LEN: usize = NetHdr::LEN;
/// Size of every buffer (one frame up to 2036 bytes per descriptor).
pub const BUF_SIZE: usize = 2048;

/// One guest on one vhost-user virtio-net port: queue 0 receives, queue 1
/// transmits.
pub struct FastGuest {
    rx: SplitRing,
    tx: SplitRing,
    tx_free: Vec<u16>,
    /// Pointers to the first RX and TX buffer; slot `i` owns the `i`th
    /// BUF_SIZE bytes after it.
    rx_buf: *mut u8,
    tx_buf: *mut u8,
    /// Their guest physical addresses.
    rx_gpa: u64,
    tx_gpa: u64,
    frame_len: usize,
    pub offered: u64,
    pub features: u64,
    // Declared last: the guest memory must outlive the rings pointing into it.
    conn: Connection,
}

impl FastGuest {
    /// Connects to a vhost-user backend at `path`, negotiates
    /// `offered & want`, maps guest memory and starts both queues with
    /// `queue_size` entries; every RX slot is posted.
    pub fn connect(path: &Path, want: u64, queue_size: u16) -> Result<FastGuest> {
        ensure!(
            queue_size.is_power_of_two() && queue_size <= 1024,
            "queue size {queue_size}"
        );
        let n = queue_size as usize;
        let page = |b: usize| b.next_multiple_of(4096);
        let rings = 2 * (page(16 * n) + page(6 + 2 * n) + page(6 + 8 * n));
        let mut conn = Connection::open(
            path,
            &Want {
                queues: 2,
                features: want,
                protocol: VhostUserProtocolFeatures::REPLY_ACK,
                mem_size: (rings + 2 * n * BUF_SIZE).next_multiple_of(2 << 20),
            },
        )?;
        ensure!(
            conn.features & feat::VERSION_1 != 0,
            "backend at {} does not offer VERSION_1 (offer {:#x})",
            path.display(),
            conn.offered
        );
        let rx = conn.start_ring(0, queue_size, 0)?;
        let tx = conn.start_ring(1, queue_size, 0)?;
        let rx_gpa = conn.ram.alloc((n * BUF_SIZE) as u64, 4096);
        let tx_gpa = conn.ram.alloc((n * BUF_SIZE) as u64, 4096);
        let mut g = FastGuest {
            rx,
            tx,
            tx_free: (0..queue_size).rev().collect(),
            rx_buf: conn.ram.ptr(rx_gpa),
            tx_buf: conn.ram.ptr(tx_gpa),
            rx_gpa,
            tx_gpa,
            frame_len: 0,
            offered: conn.offered,
            features: conn.features,
            conn,
        };
        // Every RX slot owns RX buffer `slot`, posted for good.
        let old = g.rx.avail_idx;
        for i in 0..queue_size {
            let a = g.rx_gpa + i as u64 * BUF_SIZE as u64;
            g.rx.write_desc(i, a, BUF_SIZE as u32, DESC_F_WRITE, 0);
            g.rx.push(i);
        }
        g.rx.disarm();
        g.tx.disarm();
        g.rx.publish(old);
        g.conn.enable(2).context("enabling the queues")?;
        Ok(g)
    }

    pub fn queue_size(&self) -> usize {
        self.tx.size as usize
    }

    /// Writes `frames` (all of one length) into the TX buffers, slot `i`
    /// getting `frames[i % frames.len()]`. Every TX chain must be back.
    pub fn set_frames(&mut self, frames: &[Vec<u8>]) {
        assert_eq!(
            self.tx_free.len(),
            self.queue_size(),
            "TX chains still in flight"
        );
        let len = frames[0].len();
        assert!(frames.iter().all(|f| f.len() == len) && HDR_LEN + len <= BUF_SIZE);
        for i in 0..self.tx.size {
            let off = i as usize * BUF_SIZE;
            let f = &frames[i as usize % frames.len()];
            // SAFETY: slot i's BUF_SIZE bytes lie inside the TX buffers.
            unsafe {
                let b = self.tx_buf.add(off);
                std::ptr::write_bytes(b, 0, HDR_LEN);
                std::ptr::copy_nonoverlapping(f.as_ptr(), b.add(HDR_LEN), len);
            }
            let gpa = self.tx_gpa + off as u64;
            self.tx.write_desc(i, gpa, (HDR_LEN + len) as u32, 0, 0);
        }
        self.frame_len = len;
    }

    pub fn tx_free(&self) -> usize {
        self.tx_free.len()
    }

    /// Queues `n` frames (n <= tx_free) with one avail index update.
    pub fn send(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let old = self.tx.avail_idx;
        for _ in 0..n {
            let s = self.tx_free.pop().expect("no free TX slot");
            self.tx.push(s);
        }
        self.tx.publish(old);
    }

    /// Takes back the TX chains the device returned; returns how many.
    pub fn reap_tx(&mut self) -> Result<usize> {
        let n = self.tx.pending();
        ensure!(n <= self.tx.size, "TX used index ran {n} ahead");
        for _ in 0..n {
            let (id, _) = self.tx.pop();
            ensure!(id < self.tx.size as u32, "TX used id {id} out of range");
            self.tx_free.push(id as u16);
        }
        Ok(n as usize)
    }

    /// Receives what arrived: checks each used length against the frame
    /// length given to the sender (`expect`, header included), hands the
    /// frame to `look` if given, re-posts the slots. Returns how many.
    pub fn recv(&mut self, expect: usize, mut look: Option<&mut Look>) -> Result<usize> {
        let n = self.rx.pending();
        if n == 0 {
            return Ok(0);
        }
        ensure!(n <= self.rx.size, "RX used index ran {n} ahead");
        let old = self.rx.avail_idx;
        for _ in 0..n {
            let (id, len) = self.rx.pop();
            ensure!(id < self.rx.size as u32, "RX used id {id} out of range");
            ensure!(
                len as usize == HDR_LEN + expect,
                "RX frame of {len} bytes (header included), expected {}",
                HDR_LEN + expect
            );
            if let Some(f) = look.as_mut() {
                // SAFETY: the buffer is ours again (the device returned it),
                // and len <= BUF_SIZE was checked above.
                let b = unsafe {
                    std::slice::from_raw_parts(
                        self.rx_buf.add(id as usize * BUF_SIZE),
                        len as usize,
                    )
                };
                f(&b[HDR_LEN..]);
            }
            self.rx.push(id as u16);
        }
        self.rx.publish(old);
        Ok(n as usize)
    }
}

/// What [`FastGuest::recv`] hands every received frame to.
pub type Look<'a> = dyn FnMut(&[u8]) + 'a;

/// Which queues a sleeping driver waits for, and after how many used entries.
pub struct Wake<'a> {
    pub guest: &'a FastGuest,
    pub tx_after: Option<u16>,
    pub rx_after: Option<u16>,
}

/// Arms the wanted calls, re-checks, and sleeps in ppoll(2) until one of them
/// is signalled or `timeout` passes (nanosecond resolution: a paced sender
/// sleeps for tens of microseconds). Returns false on timeout.
pub fn sleep(wakes: &[Wake], timeout: Duration) -> bool {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
    let mut ready = false;
    for w in wakes {
        let g = w.guest;
        for (ring, after) in [(&g.tx, w.tx_after), (&g.rx, w.rx_after)] {
            if let Some(k) = after {
                ring.arm(k);
                ready |= ring.pending() >= k.max(1);
                fds.push(libc::pollfd {
                    fd: ring.call.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
    }
    let woke = ready || {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
            };
            // SAFETY: fds is a valid pollfd array and ts a valid timespec for
            // the duration of the call; no signal mask is given.
            let r = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break r > 0;
        }
    };
    for f in &fds {
        drain(f.fd);
    }
    for w in wakes {
        w.guest.tx.disarm();
        w.guest.rx.disarm();
    }
    woke
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from a non-blocking eventfd into a u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// Result of one driven run.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub frames: u64,
    pub secs: f64,
    /// Times the driver slept in poll(2), and the longest sleep.
    pub sleeps: u64,
    pub max_sleep: Duration,
    /// Kicks the sender sent (the rest were suppressed by the switch).
    pub kicks: u64,
}

/// Sends bursts of `burst` frames from `a` to `b` for `duration`, keeping
/// at most `window` frames between "sent" and "received" (so that the
/// receiver always has a posted buffer for every frame in flight), then
/// drains. With `rate` (frames/s), a burst goes only when it is due: the
/// offered load is that rate, and the driver sleeps between bursts; without
/// it, bursts go as fast as the switch takes them. Fails if the switch stops
/// returning chains or frames for `stall` (a frame lost, say).
pub fn drive(
    a: &mut FastGuest,
    b: &mut FastGuest,
    burst: usize,
    window: usize,
    duration: Duration,
    stall: Duration,
    rate: Option<f64>,
) -> Result<Run> {
    let len = a.frame_len;
    assert!(len > 0, "set_frames first");
    assert!(burst <= window && window <= b.queue_size() && burst <= a.queue_size());
    let start = Instant::now();
    let deadline = start + duration;
    let (mut sent, mut got) = (0u64, 0u64);
    let mut sending = true;
    let (mut sleeps, mut max_sleep) = (0u64, Duration::ZERO);
    let kicks0 = a.tx.kicks;
    loop {
        a.reap_tx()?;
        if sending && Instant::now() >= deadline {
            sending = false;
        }
        let mut progress = false;
        // When the next burst is due (paced runs); None: now.
        let mut next_due: Option<Instant> = None;
        if sending {
            while a.tx_free() >= burst && (sent - got) as usize + burst <= window {
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64((sent + burst as u64) as f64 / r);
                    if due > Instant::now() {
                        next_due = Some(due);
                        break;
                    }
                }
                a.send(burst);
                sent += burst as u64;
                progress = true;
            }
        }
        let r = b.recv(len, None)? as u64;
        got += r;
        progress |= r > 0;
        if !sending && got == sent {
            break;
        }
        if progress {
            continue;
        }
        // Nothing to do: wait for frames (a burst's worth, or what is left)
        // and, if sending is held up by TX slots, for returned chains.
        let in_flight = (sent - got) as usize;
        let rx_after = (in_flight > 0).then(|| in_flight.min(burst) as u16);
        let tx_after = (sending && a.tx_free() < burst).then(|| (burst - a.tx_free()) as u16);
        let timeout = match next_due {
            Some(due) => due.saturating_duration_since(Instant::now()).min(stall),
            None if rx_after.is_none() && tx_after.is_none() => continue,
            None => stall,
        };
        let t = Instant::now();
        let woke = sleep(
            &[
                Wake {
                    guest: a,
                    tx_after,
                    rx_after: None,
                },
                Wake {
                    guest: b,
                    tx_after: None,
                    rx_after,
                },
            ],
            timeout,
        );
        sleeps += 1;
        max_sleep = max_sleep.max(t.elapsed());
        // (A paced wait that ran out is the pace, not a stall.)
        if !woke && next_due.is_none() && a.tx.pending() == 0 && b.rx.pending() == 0 {
            bail!(
                "stalled for {stall:?}: sent {sent}, received {got}, {} TX chains out",
                a.queue_size() - a.tx_free()
            );
        }
    }
    // Every TX chain back, so the next run may rewrite the buffers.
    let t = Instant::now();
    while a.tx_free() < a.queue_size() {
        a.reap_tx()?;
        if a.tx_free() < a.queue_size() {
            let need = (a.queue_size() - a.tx_free()) as u16;
            let w = Wake {
                guest: a,
                tx_after: Some(need),
                rx_after: None,
            };
            if !sleep(&[w], stall) && t.elapsed() > stall {
                bail!("{} TX chains never returned", a.queue_size() - a.tx_free());
            }
        }
    }
    Ok(Run {
        frames: got,
        secs: start.elapsed().as_secs_f64(),
        sleeps,
        max_sleep,
        kicks: a.tx.kicks - kicks0,
    })
}

/// Waits until the switch forwards: sends single bursts until one arrives
/// whole (a backend may still be bringing its ports up and drop the first
/// ones), checks every frame of it against `frames`, then lets the pipe go
/// quiet. Returns how many attempts it took.
pub fn prime(
    a: &mut FastGuest,
    b: &mut FastGuest,
    frames: &[Vec<u8>],
    timeout: Duration,
) -> Result<usize> {
    let len = a.frame_len;
    let burst = frames.len().min(a.tx_free());
    let deadline = Instant::now() + timeout;
    let mut attempt = 0;
    loop {
        attempt += 1;
        a.reap_tx()?;
        let n = burst.min(a.tx_free());
        a.send(n);
        let mut good = 0usize;
        let mut bad = 0usize;
        let t = Instant::now() + Duration::from_millis(500);
        while good + bad < n && Instant::now() < t {
            let mut look = |d: &[u8]| {
                if frames.iter().any(|f| f.as_slice() == d) {
                    good += 1;
                } else {
                    bad += 1;
                }
            };
            if b.recv(len, Some(&mut look))? == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        ensure!(bad == 0, "{bad} frames arrived altered");
        if good == n {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "no whole burst went through in {timeout:?} ({attempt} attempts, last {good}/{n})"
            );
        }
    }
    // Quiesce: all TX chains back, nothing more arriving.
    let t = Instant::now() + Duration::from_secs(5);
    while a.tx_free() < a.queue_size() && Instant::now() < t {
        a.reap_tx()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure!(
        a.tx_free() == a.queue_size(),
        "TX chains not returned after priming"
    );
    std::thread::sleep(Duration::from_millis(50));
    b.recv(len, None)?;
    Ok(attempt)
}

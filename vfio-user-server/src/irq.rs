//! MSI-X as a vfio-user server sees it: one eventfd per vector, set by the
//! client with `SET_IRQS`, plus the table and pending-bit array (PBA) the
//! device exposes in its BARs.
//!
//! QEMU's vfio-user client emulates the MSI-X table itself (guest accesses
//! never reach the server) but forwards PBA reads; it routes vectors by
//! handing one eventfd per vector (`DATA_EVENTFD | ACTION_TRIGGER`, one fd
//! per message with this server's `max_msg_fds` of 1), and withdraws them
//! with the same flags and no descriptors. A vector raised while it has no
//! eventfd, or while masked with `ACTION_MASK`, becomes pending and fires
//! when an eventfd arrives or it is unmasked.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;

use pci_model::MsixInfo;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_TYPE_MASK,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_IRQ_SET_DATA_TYPE_MASK, VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_PCI_REQ_IRQ_INDEX,
};

use crate::Counters;

/// The most vectors an MSI-X capability can declare.
const MAX_VECTORS: u16 = 2048;
const ENTRY_SIZE: u64 = 16;

/// The MSI-X state of one device.
pub(crate) struct Msix {
    info: Option<MsixInfo>,
    fds: Vec<Option<File>>,
    masked: Vec<bool>,
    pending: Vec<bool>,
    table: Vec<u8>,
    /// The ERR and REQ eventfds (one each): QEMU stops the VM on ERR and
    /// unplugs the device on REQ.
    aux: [Option<File>; 2],
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

/// Checks that `f` is a non-blocking eventfd, so that signalling it can
/// neither block the server nor write into something else.
fn check_eventfd(f: &File) -> bool {
    let fd = f.as_raw_fd();
    let is_eventfd = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|t| t.as_os_str() == "anon_inode:[eventfd]")
        .unwrap_or(false);
    if !is_eventfd {
        return false;
    }
    let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
        return false;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i64::from_str_radix(v.trim(), 8).ok())
        .is_some_and(|flags| flags & i64::from(libc::O_NONBLOCK) != 0)
}

impl Msix {
    pub(crate) fn new(info: Option<MsixInfo>) -> Self {
        let n = usize::from(info.map_or(0, |m| m.vectors.min(MAX_VECTORS)));
        let info = info.map(|mut m| {
            m.vectors = m.vectors.min(MAX_VECTORS);
            m
        });
        let mut m = Msix {
            info,
            fds: (0..n).map(|_| None).collect(),
            masked: vec![false; n],
            pending: vec![false; n],
            table: vec![0; n * ENTRY_SIZE as usize],
            aux: [None, None],
        };
        m.reset();
        m
    }

    /// Number of vectors.
    pub(crate) fn vectors(&self) -> u32 {
        self.fds.len() as u32
    }

    /// Function reset: table back to all-masked, nothing pending or masked
    /// by `SET_IRQS`. The eventfds stay (the client withdraws them).
    pub(crate) fn reset(&mut self) {
        self.masked.iter_mut().for_each(|m| *m = false);
        self.pending.iter_mut().for_each(|p| *p = false);
        self.table.iter_mut().for_each(|b| *b = 0);
        for e in self.table.chunks_exact_mut(ENTRY_SIZE as usize) {
            e[12] = 1; // vector control: masked
        }
    }

    /// Client gone: drop every eventfd too.
    pub(crate) fn disconnect(&mut self) {
        self.fds.iter_mut().for_each(|f| *f = None);
        self.aux = [None, None];
        self.reset();
    }

    /// Raises `vector`.
    pub(crate) fn fire(&mut self, vector: u16, c: &Counters) {
        let v = usize::from(vector);
        if v >= self.fds.len() {
            Counters::inc(&c.bad_vector);
            return;
        }
        match &self.fds[v] {
            Some(fd) if !self.masked[v] => Self::signal(fd, c),
            _ => {
                self.pending[v] = true;
                Counters::inc(&c.irqs_pending);
            }
        }
    }

    fn signal(mut fd: &File, c: &Counters) {
        match fd.write(&1u64.to_ne_bytes()) {
            Ok(8) => Counters::inc(&c.irqs_fired),
            // EAGAIN: the counter is saturated, the vector is signalled anyway.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Counters::inc(&c.irqs_fired),
            _ => Counters::inc(&c.irq_signal_errors),
        }
    }

    fn flush_pending(&mut self, v: usize, c: &Counters) {
        if self.pending[v] && !self.masked[v] {
            if let Some(fd) = &self.fds[v] {
                self.pending[v] = false;
                Self::signal(fd, c);
            }
        }
    }

    /// `VFIO_USER_DEVICE_SET_IRQS`.
    pub(crate) fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
        c: &Counters,
    ) -> std::io::Result<()> {
        let data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        if flags & !(VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK) != 0
            || data.count_ones() != 1
            || action.count_ones() != 1
        {
            return Err(einval());
        }
        if data != VFIO_IRQ_SET_DATA_EVENTFD && !fds.is_empty() {
            return Err(einval());
        }
        if index == VFIO_PCI_ERR_IRQ_INDEX || index == VFIO_PCI_REQ_IRQ_INDEX {
            let slot = &mut self.aux[(index - VFIO_PCI_ERR_IRQ_INDEX) as usize];
            return match (action, data, start, count, fds.len()) {
                (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_NONE, _, 0, _)
                | (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, 0, 1, 0) => {
                    *slot = None;
                    Ok(())
                }
                (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, 0, 1, 1) => {
                    let fd = fds.into_iter().next().filter(check_eventfd);
                    *slot = Some(fd.ok_or_else(einval)?);
                    Ok(())
                }
                (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_NONE, 0, 1, _) => {
                    if let Some(fd) = slot {
                        Self::signal(fd, c);
                    }
                    Ok(())
                }
                _ => Err(einval()),
            };
        }
        if index != VFIO_PCI_MSIX_IRQ_INDEX {
            // INTx and MSI have no vectors here: only "disable all"
            // (count 0) is meaningful, and a no-op.
            return if count == 0 && data == VFIO_IRQ_SET_DATA_NONE {
                Ok(())
            } else {
                Err(einval())
            };
        }
        if count == 0 {
            if action == VFIO_IRQ_SET_ACTION_TRIGGER && data == VFIO_IRQ_SET_DATA_NONE {
                // Disable MSI-X: withdraw every eventfd.
                self.fds.iter_mut().for_each(|f| *f = None);
                return Ok(());
            }
            return Err(einval());
        }
        let end = start.checked_add(count).ok_or_else(einval)?;
        if end > self.vectors() {
            return Err(einval());
        }
        let range = start as usize..end as usize;
        match (action, data) {
            (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_NONE) => {
                // Loopback: fire the vectors as if the device raised them.
                for v in range {
                    self.fire(v as u16, c);
                }
            }
            (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD) => {
                if fds.is_empty() {
                    for v in range {
                        self.fds[v] = None;
                    }
                } else if fds.len() == range.len() {
                    if !fds.iter().all(check_eventfd) {
                        return Err(einval());
                    }
                    for (v, fd) in range.zip(fds) {
                        self.fds[v] = Some(fd);
                        self.flush_pending(v, c);
                    }
                } else {
                    return Err(einval());
                }
            }
            (VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_DATA_NONE) => {
                for v in range {
                    self.masked[v] = true;
                }
            }
            (VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_NONE) => {
                for v in range {
                    self.masked[v] = false;
                    self.flush_pending(v, c);
                }
            }
            // DATA_BOOL is refused by the vfio_user crate before it reaches
            // us (its payload is not passed on); eventfd-driven mask and
            // unmask exist for INTx only.
            _ => {
                return Err(std::io::Error::from_raw_os_error(libc::ENOTSUP));
            }
        }
        Ok(())
    }

    /// Signals the REQ eventfd (QEMU then unplugs the device); false if
    /// the client registered none.
    pub(crate) fn request(&self, c: &Counters) -> bool {
        match &self.aux[1] {
            Some(fd) => {
                Self::signal(fd, c);
                true
            }
            None => false,
        }
    }

    fn pba_size(&self) -> u64 {
        (self.fds.len() as u64).div_ceil(64) * 8
    }

    /// If `bar`/`offset` is in the MSI-X table or PBA, serves the read.
    pub(crate) fn read(&self, bar: u8, offset: u64, data: &mut [u8]) -> bool {
        let Some(m) = self.info else { return false };
        if bar == m.table_bar {
            if let Some(o) = offset.checked_sub(u64::from(m.table_offset)) {
                if o < self.table.len() as u64 {
                    for (i, d) in data.iter_mut().enumerate() {
                        *d = usize::try_from(o)
                            .ok()
                            .and_then(|o| o.checked_add(i))
                            .and_then(|o| self.table.get(o).copied())
                            .unwrap_or(0);
                    }
                    return true;
                }
            }
        }
        if bar == m.pba_bar {
            if let Some(o) = offset.checked_sub(u64::from(m.pba_offset)) {
                if o < self.pba_size() {
                    for (i, d) in data.iter_mut().enumerate() {
                        let byte = o.saturating_add(i as u64);
                        let mut v = 0u8;
                        for bit in 0..8u64 {
                            let vec = byte.saturating_mul(8).saturating_add(bit);
                            if usize::try_from(vec)
                                .ok()
                                .and_then(|x| self.pending.get(x))
                                .copied()
                                .unwrap_or(false)
                            {
                                v |= 1 << bit;
                            }
                        }
                        *d = v;
                    }
                    return true;
                }
            }
        }
        false
    }

    /// If `bar`/`offset` is in the MSI-X table or PBA, takes the write
    /// (table: stored; PBA: read-only, ignored).
    pub(crate) fn write(&mut self, bar: u8, offset: u64, data: &[u8]) -> bool {
        let Some(m) = self.info else { return false };
        if bar == m.table_bar {
            if let Some(o) = offset.checked_sub(u64::from(m.table_offset)) {
                if o < self.table.len() as u64 {
                    for (i, d) in data.iter().enumerate() {
                        if let Some(b) = usize::try_from(o)
                            .ok()
                            .and_then(|o| o.checked_add(i))
                            .and_then(|o| self.table.get_mut(o))
                        {
                            *b = *d;
                        }
                    }
                    return true;
                }
            }
        }
        if bar == m.pba_bar {
            if let Some(o) = offset.checked_sub(u64::from(m.pba_offset)) {
                if o < self.pba_size() {
                    return true;
                }
            }
        }
        false
    }
}

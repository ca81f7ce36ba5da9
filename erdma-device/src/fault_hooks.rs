//! The device's side of the driver bench's faults: adding and clearing
//! rules, and the hooks the command queue, the data path, the event queues
//! and the CQ writer call (the rule types and their parsing are
//! `faults.rs`, which knows nothing of the device).

use pci_model::{DeviceIo, FaultError, FaultSpec, FaultStatus, TraceKind};

use crate::cq::Cqe;
use crate::device::ErdmaDevice;
use crate::faults::{CmdOpcode, ErdmaFault};
use crate::names;

impl ErdmaDevice {
    /// Adds a rule (`PciDevice::add_fault`); immediate kinds act now.
    pub(crate) fn fault_add(
        &mut self,
        id: u32,
        spec: &FaultSpec,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        let kind = ErdmaFault::parse(spec)?;
        self.faults.rules.add(id, spec, kind.clone())?;
        let immediate = matches!(
            kind,
            ErdmaFault::Aeq { .. } | ErdmaFault::PortDown | ErdmaFault::PortUp
        );
        if !immediate {
            if let ErdmaFault::QpStall { qpn } = kind {
                io.trace(TraceKind::Fault, || {
                    format!("rule {id} qp-stall qpn={qpn}: SQ not executed until cleared")
                });
            }
            return Ok(());
        }
        if !self.faults.rules.fire_id(id) {
            return Ok(());
        }
        match kind {
            ErdmaFault::Aeq {
                event,
                data0,
                error,
            } => {
                io.trace(TraceKind::Fault, || {
                    format!(
                        "rule {id} aeq {} data0={data0}{}",
                        names::ae_type(event),
                        if error { " (QP to ERROR)" } else { "" }
                    )
                });
                if error {
                    self.enter_error(data0);
                }
                self.async_event(io, crate::eq::aeqe(event, 0, data0, 0));
            }
            ErdmaFault::PortDown => {
                io.trace(TraceKind::Fault, || format!("rule {id} port-down"));
                self.port_set(false, Some(id), io);
            }
            _ => {
                io.trace(TraceKind::Fault, || format!("rule {id} port-up"));
                self.port_set(true, Some(id), io);
            }
        }
        Ok(())
    }

    /// Removes rules and undoes their lasting effects.
    pub(crate) fn fault_clear(
        &mut self,
        id: Option<u32>,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        let removed = self.faults.rules.clear(id)?;
        for r in removed {
            match r.kind {
                ErdmaFault::QpStall { qpn } if !self.qp_stalled(qpn) => {
                    io.trace(TraceKind::Fault, || {
                        format!("rule {} cleared: QP {qpn} SQ runs again", r.id)
                    });
                    self.sq_kicks.insert(qpn);
                }
                ErdmaFault::PortDown if self.faults.port_down == Some(Some(r.id)) => {
                    io.trace(TraceKind::Fault, || {
                        format!("rule {} cleared: port up again", r.id)
                    });
                    self.port_set(true, None, io);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The rules' status.
    pub(crate) fn fault_status(&self) -> Vec<FaultStatus> {
        self.faults.rules.status()
    }

    /// Port up or down (`by`: the rule, `None` for `set_link`).
    pub(crate) fn port_set(&mut self, up: bool, by: Option<u32>, io: &mut DeviceIo<'_>) {
        let was_up = self.faults.port_down.is_none();
        self.faults.port_down = if up { None } else { Some(by) };
        if was_up != up {
            io.trace(TraceKind::Event, || {
                format!(
                    "port {} (no driver event: the 7.3 driver follows its netdev)",
                    if up { "up" } else { "down" }
                )
            });
            if up {
                // Work that waited for the wire goes on.
                self.sq_kicks.extend(self.qps.keys().copied());
            }
        }
    }

    /// The port is down: frames are neither sent nor taken.
    pub(crate) fn port_is_down(&self) -> bool {
        self.faults.port_down.is_some()
    }

    /// A `qp-stall` rule holds QP `qpn`'s SQ.
    pub(crate) fn qp_stalled(&self, qpn: u32) -> bool {
        !self.faults.rules.is_empty()
            && self
                .faults
                .rules
                .iter()
                .any(|r| r.kind == ErdmaFault::QpStall { qpn })
    }

    /// A stalled QP had work to run: the first time, the rule counts a hit
    /// (`ctl device-fault list`), as gve's `tx-stall` does.
    pub(crate) fn qp_stall_hit(&mut self, qpn: u32, io: &mut DeviceIo<'_>) {
        if let Some(r) = self
            .faults
            .rules
            .fire(|k| *k == ErdmaFault::QpStall { qpn })
        {
            let id = r.id;
            io.trace(TraceKind::Fault, || {
                format!("rule {id} qp-stall qpn={qpn}: SQ work held")
            });
        }
    }

    /// The command-queue hook: what a rule does to command (`submod`,
    /// `opcode`): `None` to run it, `Some(None)` to drop it (timeout),
    /// `Some(Some(status))` to fail it.
    pub(crate) fn cmd_fault(
        &mut self,
        submod: u8,
        opcode: u8,
        io: &mut DeviceIo<'_>,
    ) -> Option<Option<u8>> {
        if self.faults.rules.is_empty() {
            return None;
        }
        let m = |c: &Option<CmdOpcode>| c.is_none_or(|c| c.submod == submod && c.opcode == opcode);
        let r = self.faults.rules.fire(|k| match k {
            ErdmaFault::CmdqTimeout { cmd } => m(cmd),
            ErdmaFault::CmdStatus { cmd, .. } => m(cmd),
            _ => false,
        })?;
        let id = r.id;
        let out = match r.kind {
            ErdmaFault::CmdStatus { status, .. } => Some(status),
            _ => None,
        };
        let name = names::cmd_opcode(submod, opcode);
        io.trace(TraceKind::Fault, || match out {
            Some(st) => format!("rule {id} cmd-status: {name} not executed, status {st}"),
            None => format!("rule {id} cmdq-timeout: {name} taken, never completed"),
        });
        Some(out)
    }

    /// The CQE hook: a `cqe-status` rule may turn a successful CQE into an
    /// error; returns true when it did (the caller moves the QP to ERROR).
    pub(crate) fn cqe_fault(&mut self, cqe: &mut Cqe, io: &mut DeviceIo<'_>) -> bool {
        if self.faults.rules.is_empty() || cqe.syndrome != crate::cq::wc_status::SUCCESS {
            return false;
        }
        let (q, op) = (cqe.qpn, cqe.opcode);
        let Some(r) = self.faults.rules.fire(|k| match k {
            ErdmaFault::CqeStatus { qpn, opcode, .. } => {
                qpn.is_none_or(|n| n == q) && opcode.is_none_or(|o| o == op)
            }
            _ => false,
        }) else {
            return false;
        };
        let ErdmaFault::CqeStatus { status, .. } = r.kind else {
            return false;
        };
        let id = r.id;
        cqe.syndrome = status;
        io.trace(TraceKind::Fault, || {
            format!(
                "rule {id} cqe-status: QP {q} {} -> {}",
                names::opcode(op),
                names::wc_status(status)
            )
        });
        true
    }
}

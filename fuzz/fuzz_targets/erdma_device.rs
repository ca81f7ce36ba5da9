//! The emulated erdma function (`erdma-device`) under a hostile driver:
//! registers, command-queue commands, EQ/CQ/QP doorbells, SQ WQEs, MTTs and
//! RoCEv2 frames all come from the input (see `pci_driver.rs`).
//! Invariant: no panic.
#![no_main]

#[path = "pci_driver.rs"]
mod pci_driver;

use erdma_device::{ErdmaConfig, ErdmaDevice};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dev = ErdmaDevice::new(ErdmaConfig::new([0x52, 0x54, 0, 0, 0, 1]));
    let _ = pci_driver::drive(&mut dev, &mut Unstructured::new(data));
});

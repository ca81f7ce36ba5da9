//! The emulated gVNIC (`gve-device`) under a hostile driver: registers,
//! admin queue commands, DQO TX descriptors, RX buffers and frames all come
//! from the input (see `pci_driver.rs`). Invariant: no panic.
#![no_main]

#[path = "pci_driver.rs"]
mod pci_driver;

use gve_device::{GveConfig, GveDevice};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dev = GveDevice::new(GveConfig::default());
    let _ = pci_driver::drive(&mut dev, &mut Unstructured::new(data));
});

//! The fault timer thread: it releases the frames fault rules delayed or
//! reordered, switching them like new ones at the time it read. The fabric
//! gives the means ([`Fabric::start_fault_timer`]); the server starts it.

use super::{Batch, Fabric};
use crate::frame::{Dir, LazyView};
use std::sync::Arc;
use std::time::Instant;

impl Fabric {
    /// Starts the thread that releases delayed and reordered frames (the
    /// server does; without it such rules drop what they would hold).
    pub fn start_fault_timer(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        self.faults.timer_started();
        std::thread::Builder::new()
            .name("fault-timer".into())
            .spawn(move || me.faults.run_timer(|r, now| me.resume(r, now)))
    }

    /// Ends the fault timer thread.
    pub fn stop_fault_timer(&self) {
        self.faults.stop_timer();
    }

    /// A frame a fault rule held comes back.
    fn resume(&self, r: crate::faults::Released, now: Instant) {
        let (port, dir) = (r.port, r.dir);
        let mut wakes = Batch::new(now);
        for f in self.faults.apply_after_at(r, now) {
            let v = LazyView::default();
            match dir {
                Dir::Egress => {
                    self.deliver_now(port, f, &v, None, false, &mut wakes);
                }
                _ => {
                    self.switch(port, f, &v, &mut wakes);
                }
            }
        }
    }
}

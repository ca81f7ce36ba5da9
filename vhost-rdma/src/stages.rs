//! Stages: what sees frames at the fabric's two points besides switching
//! itself. At **ingress** (a frame a port sent, before it is switched) the
//! capture, the protocol checker and fault injection run, in that order; at
//! **egress** (a frame about to be queued for a port, after its offloads are
//! finished for that receiver) fault injection and the capture run.
//!
//! The switch only runs a list of stages at each point; a stage that is not
//! [`active`](Stage::active) costs a frame one relaxed load, and when no stage
//! is active a frame passes without any allocation. A stage may pass a frame
//! on untouched, or take it and put what goes on in its place: nothing
//! (dropped, or held to come back later through the fault timer), a changed
//! frame, or several.

use crate::frame::{Dir, Frame, FrameView, LazyView};
use std::time::Instant;

/// Where and when a stage sees a frame.
#[derive(Debug)]
pub struct StageCtx<'a> {
    /// The port that sent the frame (ingress) or will receive it (egress).
    pub port: usize,
    /// Its name.
    pub port_name: &'a str,
    /// Which point: [`Dir::Ingress`] or [`Dir::Egress`].
    pub dir: Dir,
    /// The time, passed in by the port that read the clock (the fabric and
    /// its stages read none).
    pub now: Instant,
}

/// One stage at a point of the fabric.
pub trait Stage: Sync {
    /// Whether the stage acts now (a capture runs, the checker is on, fault
    /// rules or downed links exist).
    fn active(&self) -> bool;

    /// Sees a frame. Returns it to pass it on unchanged, or takes it and
    /// appends what goes on instead to `out` (each with its view).
    fn process(
        &self,
        cx: &StageCtx<'_>,
        frame: Frame,
        view: &LazyView,
        out: &mut Vec<(Frame, FrameView)>,
    ) -> Option<Frame>;
}

/// What comes out of a point's stages.
#[derive(Debug)]
pub enum Passed {
    /// The frame, untouched: its view (if parsed) still holds.
    Same(Frame),
    /// What a stage put in the frame's place (possibly nothing).
    Changed(Vec<(Frame, FrameView)>),
}

/// Runs `frame` through `stages` in order at time `now`. `view` is the
/// frame's view (parsed only if a stage reads it).
pub fn run(
    stages: &[&dyn Stage],
    port: usize,
    port_name: &str,
    dir: Dir,
    now: Instant,
    frame: Frame,
    view: &LazyView,
) -> Passed {
    let mut cur = Passed::Same(frame);
    let cx = StageCtx {
        port,
        port_name,
        dir,
        now,
    };
    for stage in stages {
        if !stage.active() {
            continue;
        }
        cur = match cur {
            Passed::Same(f) => {
                let mut out = Vec::new();
                match stage.process(&cx, f, view, &mut out) {
                    Some(f) => Passed::Same(f),
                    None => Passed::Changed(out),
                }
            }
            Passed::Changed(frames) => {
                let mut next = Vec::with_capacity(frames.len());
                for (f, v) in frames {
                    let lazy = LazyView::of(v);
                    if let Some(f) = stage.process(&cx, f, &lazy, &mut next) {
                        next.push((f, v));
                    }
                }
                Passed::Changed(next)
            }
        };
    }
    cur
}

/// A stage that only looks: it sees each frame and always passes it on
/// unchanged (the capture, the protocol checker). Every observer is a
/// [`Stage`] through the impl below.
pub trait Observer: Sync {
    /// Whether it looks now (see [`Stage::active`]).
    fn watching(&self) -> bool;

    /// Sees `frame` at the point and time `cx` names.
    fn see(&self, cx: &StageCtx<'_>, frame: &Frame);
}

impl<T: Observer> Stage for T {
    fn active(&self) -> bool {
        self.watching()
    }
    fn process(
        &self,
        cx: &StageCtx<'_>,
        frame: Frame,
        _view: &LazyView,
        _out: &mut Vec<(Frame, FrameView)>,
    ) -> Option<Frame> {
        self.see(cx, &frame);
        Some(frame)
    }
}

impl Observer for crate::capture::Capture {
    fn watching(&self) -> bool {
        crate::capture::Capture::active(self)
    }
    fn see(&self, cx: &StageCtx<'_>, frame: &Frame) {
        self.record(cx.port, cx.dir, &frame.data);
    }
}

impl Observer for crate::checker::FabricChecker {
    fn watching(&self) -> bool {
        self.enabled()
    }
    fn see(&self, cx: &StageCtx<'_>, frame: &Frame) {
        // The checker judges what the ports sent, before any fault acts.
        if cx.dir == Dir::Ingress {
            self.observe(cx.now, cx.port_name, &frame.data);
        }
    }
}

impl Stage for crate::faults::Faults {
    fn active(&self) -> bool {
        crate::faults::Faults::active(self)
    }
    fn process(
        &self,
        cx: &StageCtx<'_>,
        frame: Frame,
        view: &LazyView,
        out: &mut Vec<(Frame, FrameView)>,
    ) -> Option<Frame> {
        let v = *view.get(&frame.data);
        out.extend(self.apply_view(cx.port, cx.dir, &v, frame, cx.now));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    /// Counts what it sees; doubles frames when asked.
    #[derive(Default)]
    struct Probe {
        on: AtomicBool,
        seen: AtomicUsize,
        double: bool,
    }

    impl Stage for Probe {
        fn active(&self) -> bool {
            self.on.load(Relaxed)
        }
        fn process(
            &self,
            _cx: &StageCtx<'_>,
            frame: Frame,
            view: &LazyView,
            out: &mut Vec<(Frame, FrameView)>,
        ) -> Option<Frame> {
            self.seen.fetch_add(1, Relaxed);
            if !self.double {
                return Some(frame);
            }
            let v = *view.get(&frame.data);
            out.push((frame.clone(), v));
            out.push((frame, v));
            None
        }
    }

    fn frame() -> Frame {
        Frame {
            data: vec![0u8; 60],
            ..Default::default()
        }
    }

    #[test]
    fn inactive_stages_are_skipped_and_taken_frames_flow_on() {
        let observer = Probe::default();
        let doubler = Probe {
            double: true,
            ..Default::default()
        };
        let after = Probe::default();
        let stages: [&dyn Stage; 3] = [&observer, &doubler, &after];
        let v = LazyView::default();
        // Nothing active: the frame passes as it is.
        assert!(matches!(
            run(&stages, 0, "a", Dir::Ingress, Instant::now(), frame(), &v),
            Passed::Same(_)
        ));
        assert_eq!(observer.seen.load(Relaxed), 0);
        for p in [&observer, &doubler, &after] {
            p.on.store(true, Relaxed);
        }
        match run(&stages, 0, "a", Dir::Ingress, Instant::now(), frame(), &v) {
            Passed::Changed(out) => assert_eq!(out.len(), 2),
            Passed::Same(_) => panic!("the doubler took the frame"),
        }
        assert_eq!(observer.seen.load(Relaxed), 1);
        assert_eq!(doubler.seen.load(Relaxed), 1);
        assert_eq!(after.seen.load(Relaxed), 2, "each copy goes on");
    }
}

//! The driver bench through the control socket, on a small fake device
//! model (the real models' kinds are their own crates' tests): device
//! fault rules (add, list with counters, clear, errors), `ctl link`
//! reaching the model, `ctl status`, and the device trace (file, bound,
//! refusals, show, follow).

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::config::{Limits, PortConfig};
    use crate::control::{follow_trace, request, ControlServer, ReplyBody, Request, Status};
    use pci_model::fault::FaultRules;
    use pci_model::{
        BarInfo, DeviceIo, FaultError, FaultKindInfo, FaultSpec, FaultStatus, MsixInfo,
        PciIdentity, RxRefusal, TraceKind,
    };
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        /// Immediate: vector 1 now.
        Irq,
        /// Lasting until cleared.
        Stall,
        /// Fires on reads of register 0 (which then reads 0xdead).
        OnRead,
    }

    const KINDS: &[FaultKindInfo] = &[
        FaultKindInfo {
            name: "irq",
            params: &[],
            doc: "raises vector 1 now",
        },
        FaultKindInfo {
            name: "stall",
            params: &[],
            doc: "stalls until cleared",
        },
        FaultKindInfo {
            name: "on-read",
            params: &[],
            doc: "register 0 reads 0xdead",
        },
    ];

    #[derive(Default)]
    struct Fake {
        rules: FaultRules<Kind>,
        stalled: bool,
        link_up: Option<bool>,
    }

    impl PciDevice for Fake {
        fn identity(&self) -> PciIdentity {
            PciIdentity {
                vendor_id: 0x1b36,
                device_id: 0x00f1,
                subsystem_vendor_id: 0x1b36,
                subsystem_id: 1,
                class_code: 0xff0000,
                revision: 1,
            }
        }
        fn bars(&self) -> Vec<BarInfo> {
            test_bars()
        }
        fn msix(&self) -> Option<MsixInfo> {
            Some(MsixInfo {
                vectors: 2,
                table_bar: 0,
                table_offset: 0x800,
                pba_bar: 0,
                pba_offset: 0xc00,
            })
        }
        fn bar_read(&mut self, _: u8, offset: u64, data: &mut [u8], io: &mut DeviceIo<'_>) {
            let mut v: u32 = if offset == 0 { 0x1234 } else { 0 };
            if offset == 0 {
                if let Some(r) = self.rules.fire(|k| *k == Kind::OnRead) {
                    let id = r.id;
                    io.trace(TraceKind::Fault, || format!("rule {id} on-read"));
                    v = 0xdead;
                }
            }
            let b = v.to_le_bytes();
            let n = data.len().min(4);
            data[..n].copy_from_slice(&b[..n]);
        }
        fn bar_write(&mut self, _: u8, _: u64, _: &[u8], _: &mut DeviceIo<'_>) {}
        fn poll(&mut self, _: &mut DeviceIo<'_>) {}
        fn receive(
            &mut self,
            _: &[u8],
            _view: &pci_model::ParsedFrame,
            _: &mut DeviceIo<'_>,
        ) -> Result<(), RxRefusal> {
            Err(RxRefusal::NotReady)
        }
        fn reset(&mut self) {}
        fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
            (bar == 0 && offset == 0).then_some("FAKE_STATUS")
        }
        fn fault_kinds(&self) -> &'static [FaultKindInfo] {
            KINDS
        }
        fn add_fault(
            &mut self,
            id: u32,
            spec: &FaultSpec,
            io: &mut DeviceIo<'_>,
        ) -> Result<(), FaultError> {
            spec.check_params(&[])?;
            let kind = match spec.kind.as_str() {
                "irq" => Kind::Irq,
                "stall" => Kind::Stall,
                "on-read" => Kind::OnRead,
                k => {
                    return Err(FaultError::UnknownKind {
                        kind: k.into(),
                        known: "irq, stall, on-read".into(),
                    })
                }
            };
            self.rules.add(id, spec, kind)?;
            match kind {
                Kind::Irq => {
                    if self.rules.fire(|k| *k == Kind::Irq).is_some() {
                        io.trace(TraceKind::Fault, || format!("rule {id} irq"));
                        io.irqs.push(1);
                    }
                }
                Kind::Stall => self.stalled = true,
                Kind::OnRead => {}
            }
            Ok(())
        }
        fn clear_faults(
            &mut self,
            id: Option<u32>,
            _: &mut DeviceIo<'_>,
        ) -> Result<(), FaultError> {
            self.rules.clear(id)?;
            self.stalled = self.rules.iter().any(|r| r.kind == Kind::Stall);
            Ok(())
        }
        fn faults(&self) -> Vec<FaultStatus> {
            self.rules.status()
        }
        fn set_link(&mut self, up: bool, io: &mut DeviceIo<'_>) -> bool {
            self.link_up = Some(up);
            io.trace(TraceKind::Event, || {
                format!("link {}", if up { "up" } else { "down" })
            });
            io.irqs.push(0);
            true
        }
    }

    impl Describe for Fake {
        fn detail(&self) -> DeviceDetail {
            DeviceDetail::Erdma(Box::new(ErdmaStatus {
                status_register: 0,
                path_mtu: 1024,
                counters: Default::default(),
                last_rx_refusal: None,
                last_error_completion: None,
            }))
        }
    }

    struct Rig {
        dir: PathBuf,
        ctl: PathBuf,
        dev_sock: PathBuf,
        handle: DeviceHandle<Fake>,
        control: Option<ControlServer>,
        server: Option<std::thread::JoinHandle<Result<(), vfio_user_server::Error>>>,
    }

    impl Rig {
        fn new(tag: &str, capture_dir: bool, limits: Limits) -> Rig {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "vhr-bench-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut g = PortConfig::gve("g", dir.join("g.sock"));
            g.queue_pairs = 1;
            let v = PortConfig::new("v", dir.join("v.sock"));
            let ports = [g, v]
                .iter()
                .enumerate()
                .map(|(i, c)| Arc::new(crate::ports::attach(i, c).unwrap()))
                .collect();
            let fabric = Arc::new(Fabric::with_limits(ports, limits));
            if capture_dir {
                fabric.capture.set_dir(dir.join("captures"));
            }
            let dev_sock = dir.join("dev.sock");
            let listener = UnixListener::bind(&dev_sock).unwrap();
            let server = VfioUserServer::from_listener(
                listener,
                Fake::default(),
                |_: pci_model::Frame| {},
                vfio_user_server::Limits::default(),
            )
            .unwrap();
            let handle = server.handle();
            let thread = std::thread::spawn(move || server.run());
            let served: Arc<dyn Served> = Arc::new(handle.clone());
            let entry = DeviceEntry {
                port: "g".into(),
                handle: served.clone(),
                pump: Arc::default(),
                held_limit: 1,
                trace: Arc::new(port_trace("g", &served)),
            };
            let ctl = dir.join("ctl.sock");
            let control = ControlServer::start(
                crate::control::bind_control_socket(&ctl, None).unwrap(),
                fabric,
                Arc::new(Vec::new()),
                Arc::new(vec![entry]),
                Arc::new(Vec::new()),
            )
            .unwrap();
            Rig {
                dir,
                ctl,
                dev_sock,
                handle,
                control: Some(control),
                server: Some(thread),
            }
        }

        fn ok(&self, req: &Request) -> crate::control::Reply {
            let r = request(&self.ctl, req).unwrap();
            assert!(r.ok, "{req:?}: {:?}", r.error);
            r
        }

        fn refused(&self, req: &Request) -> String {
            let r = request(&self.ctl, req).unwrap();
            assert!(!r.ok, "{req:?} was not refused");
            r.error.unwrap()
        }

        fn rules(&self) -> Vec<(u32, String, u64, u64)> {
            let ports = self
                .ok(&Request::DeviceFaultList)
                .into_device_faults()
                .unwrap();
            assert_eq!(ports.len(), 1);
            assert_eq!(
                (ports[0].port.as_str(), ports[0].kind.as_str()),
                ("g", "erdma")
            );
            ports[0]
                .rules
                .iter()
                .map(|r| (r.id, r.kind.clone(), r.matched, r.hits))
                .collect()
        }

        fn status(&self) -> Status {
            self.ok(&Request::Status).into_status().unwrap()
        }

        fn client(&self) -> vfio_user::Client {
            vfio_user::Client::new(&self.dev_sock).unwrap()
        }

        fn captures(&self) -> PathBuf {
            self.dir.join("captures")
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            if let Some(c) = self.control.take() {
                c.stop();
            }
            self.handle.stop();
            if let Some(t) = self.server.take() {
                let _ = t.join();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn add(port: &str, kind: &str) -> Request {
        Request::DeviceFaultAdd {
            rule: Box::new(bench::DeviceFaultSpec {
                port: port.into(),
                kind: kind.into(),
                ..Default::default()
            }),
        }
    }

    fn read0(c: &mut vfio_user::Client, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.region_read(0, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    #[test]
    fn fault_rules_round_trip_through_the_control_socket() {
        let rig = Rig::new("faults", false, Limits::default());
        let r = rig.ok(&add("g", "irq"));
        assert_eq!(r.device_fault_id(), Some(1));
        assert_eq!(rig.rules(), [(1, "irq".into(), 1, 1)]);
        let r = rig.ok(&Request::DeviceFaultAdd {
            rule: Box::new(bench::DeviceFaultSpec {
                port: "g".into(),
                kind: "on-read".into(),
                count: Some(2),
                id: Some(5),
                ..Default::default()
            }),
        });
        assert_eq!(r.device_fault_id(), Some(5));
        let mut c = rig.client();
        let reads: Vec<u32> = (0..3).map(|_| read0(&mut c, 0)).collect();
        assert_eq!(reads, [0xdead, 0xdead, 0x1234], "count 2, then spent");
        assert_eq!(
            rig.rules(),
            [(1, "irq".into(), 1, 1), (5, "on-read".into(), 2, 2)]
        );
        // Next id: one more than the highest.
        assert_eq!(rig.ok(&add("g", "stall")).device_fault_id(), Some(6));
        assert!(rig.handle.with_device(|d| d.stalled));
        // ctl status shows them with their counters.
        let st = rig.status();
        let hits: Vec<(u32, u64)> = st.devices[0]
            .faults
            .iter()
            .map(|r| (r.id, r.hits))
            .collect();
        assert_eq!(hits, [(1, 1), (5, 2), (6, 0)]);
        assert!(st.devices[0].faults[1].spent);
        // Errors: unknown port, not a device port, the model's refusals.
        assert_eq!(rig.refused(&add("nope", "irq")), "no port named \"nope\"");
        assert_eq!(
            rig.refused(&add("v", "irq")),
            "port v is a virtio-net port: device faults need kind=gve or kind=erdma"
        );
        assert_eq!(
            rig.refused(&add("g", "bogus")),
            "port g: device fault kind \"bogus\" is not one of this device's: irq, stall, on-read"
        );
        let dup = Request::DeviceFaultAdd {
            rule: Box::new(bench::DeviceFaultSpec {
                port: "g".into(),
                kind: "irq".into(),
                id: Some(5),
                ..Default::default()
            }),
        };
        assert_eq!(rig.refused(&dup), "port g: device fault rule 5 exists");
        let bad_param = Request::DeviceFaultAdd {
            rule: Box::new(bench::DeviceFaultSpec {
                port: "g".into(),
                kind: "irq".into(),
                params: [("queue".to_string(), "1".to_string())].into(),
                ..Default::default()
            }),
        };
        assert!(rig
            .refused(&bad_param)
            .starts_with("port g: device fault irq: no parameter \"queue\""));
        assert_eq!(
            rig.refused(&Request::DeviceFaultKinds { port: "v".into() }),
            "port v is a virtio-net port: device faults need kind=gve or kind=erdma"
        );
        let r = rig.ok(&Request::DeviceFaultKinds { port: "g".into() });
        let Some(ReplyBody::DeviceFaultKinds { fault_kinds }) = r.body else {
            panic!("not a kinds reply");
        };
        let names: Vec<&str> = fault_kinds.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["irq", "stall", "on-read"]);
        // Clear: one by id (no port: the one holding it), unknown ids, all.
        rig.ok(&Request::DeviceFaultClear {
            port: None,
            id: Some(5),
        });
        assert_eq!(rig.rules().iter().map(|r| r.0).collect::<Vec<_>>(), [1, 6]);
        assert_eq!(
            rig.refused(&Request::DeviceFaultClear {
                port: None,
                id: Some(5)
            }),
            "no device fault rule 5 on any device port"
        );
        assert_eq!(
            rig.refused(&Request::DeviceFaultClear {
                port: Some("g".into()),
                id: Some(9)
            }),
            "port g: no device fault rule 9"
        );
        rig.ok(&Request::DeviceFaultClear {
            port: Some("g".into()),
            id: Some(6),
        });
        assert!(
            !rig.handle.with_device(|d| d.stalled),
            "clearing ends a lasting fault"
        );
        rig.ok(&Request::DeviceFaultClear {
            port: None,
            id: None,
        });
        assert!(rig.rules().is_empty());
    }

    #[test]
    fn link_on_a_device_port_reaches_the_model() {
        let rig = Rig::new("link", false, Limits::default());
        let r = rig.ok(&Request::Link {
            port: "g".into(),
            up: false,
        });
        let links = r.into_faults().unwrap().links;
        assert!(
            links.iter().any(|l| l.port == "g" && !l.up),
            "the fabric link too"
        );
        assert_eq!(rig.handle.with_device(|d| d.link_up), Some(false));
        rig.ok(&Request::Link {
            port: "g".into(),
            up: true,
        });
        assert_eq!(rig.handle.with_device(|d| d.link_up), Some(true));
        // A virtio-net port's link is the fabric's alone.
        rig.ok(&Request::Link {
            port: "v".into(),
            up: false,
        });
        assert_eq!(rig.handle.with_device(|d| d.link_up), Some(true));
    }

    fn start(file: Option<&str>) -> Request {
        Request::TraceStart {
            port: "g".into(),
            file: file.map(PathBuf::from),
        }
    }

    fn stop() -> Request {
        Request::TraceStop { port: "g".into() }
    }

    #[test]
    fn a_trace_file_has_named_registers_irqs_and_faults() {
        let rig = Rig::new("trace", true, Limits::default());
        let mut c = rig.client();
        assert_eq!(read0(&mut c, 0), 0x1234);
        let st = rig.ok(&start(Some("t.log"))).into_trace().unwrap();
        assert!(st.running);
        assert_eq!(
            rig.refused(&start(None)),
            "a trace of port g runs already; stop it first"
        );
        assert_eq!(read0(&mut c, 0), 0x1234);
        assert_eq!(read0(&mut c, 0x10), 0);
        rig.ok(&add("g", "irq"));
        rig.ok(&Request::Link {
            port: "g".into(),
            up: false,
        });
        let st = rig.status().devices[0].trace.clone();
        assert!(st.running && st.records >= 5, "{st:?}");
        let st = rig.ok(&stop()).into_trace().unwrap();
        assert!(!st.running);
        assert_eq!(rig.refused(&stop()), "no trace of port g runs");
        let text = std::fs::read_to_string(rig.captures().join("t.log")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64, st.written, "{text}");
        assert_eq!(st.bytes, text.len() as u64);
        assert!(lines.iter().all(|l| l.starts_with("g ")), "{text}");
        let has = |kind: &str, what: &str| {
            lines
                .iter()
                .any(|l| l.split_whitespace().nth(2) == Some(kind) && l.contains(what))
        };
        assert!(has("rd", "bar0+0x0 FAKE_STATUS = 0x00001234"), "{text}");
        assert!(has("rd", "bar0+0x10 = 0x00000000"), "{text}");
        assert!(has("fault", "rule 1 irq"), "{text}");
        assert!(has("irq", "msi-x vector 1"), "{text}");
        assert!(has("event", "link down"), "{text}");
        assert!(has("irq", "msi-x vector 0"), "{text}");
        assert_eq!(
            lines.iter().filter(|l| l.contains("FAKE_STATUS")).count(),
            1,
            "only while it ran"
        );
        // The ring keeps them for `trace show`.
        let r = rig.ok(&Request::TraceShow { port: "g".into() });
        let Some(ReplyBody::TraceShown { trace_lines, .. }) = r.body else {
            panic!("not a show reply");
        };
        assert_eq!(trace_lines.len(), lines.len());
        // Never over an existing file, never outside the capture directory.
        let e = rig.refused(&start(Some("t.log")));
        assert!(
            e.ends_with("exists; a capture never replaces a file, choose a new name"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(rig.captures().join("t.log")).unwrap(),
            text
        );
        let e = rig.refused(&start(Some("/tmp/t.log")));
        assert_eq!(
            e,
            "/tmp/t.log: a trace file is a plain name, created in the capture directory"
        );
        for f in ["sub/t.log", "../t.log", ".."] {
            let e = rig.refused(&start(Some(f)));
            assert!(
                e.contains("captures go only into the capture directory"),
                "{f}: {e}"
            );
        }
        assert!(!rig.dir.join("t.log").exists());
        // Not a device port.
        let e = rig.refused(&Request::TraceStart {
            port: "v".into(),
            file: None,
        });
        assert_eq!(
            e,
            "port v is a virtio-net port: device traces need kind=gve or kind=erdma"
        );
    }

    #[test]
    fn trace_files_need_capture_dir() {
        let rig = Rig::new("nodir", false, Limits::default());
        let e = rig.refused(&start(Some("t.log")));
        assert!(
            e.starts_with("trace files need the daemon's --capture-dir"),
            "{e}"
        );
        assert!(!rig.status().devices[0].trace.running);
        // Without a file the ring works.
        rig.ok(&start(None));
        let mut c = rig.client();
        read0(&mut c, 0);
        rig.ok(&stop());
        let r = rig.ok(&Request::TraceShow { port: "g".into() });
        let Some(ReplyBody::TraceShown { trace_lines, .. }) = r.body else {
            panic!("not a show reply");
        };
        assert!(
            trace_lines.iter().any(|l| l.contains("FAKE_STATUS")),
            "{trace_lines:?}"
        );
    }

    #[test]
    fn the_trace_file_is_bounded() {
        let limits = Limits {
            trace_max_bytes: 300,
            ..Limits::default()
        };
        let rig = Rig::new("bound", true, limits);
        rig.ok(&start(Some("b.log")));
        let mut c = rig.client();
        for _ in 0..50 {
            read0(&mut c, 0);
        }
        let st = rig.ok(&stop()).into_trace().unwrap();
        let len = std::fs::metadata(rig.captures().join("b.log"))
            .unwrap()
            .len();
        assert!(len <= 300 && len > 200, "{len}");
        assert!(st.file_full, "{st:?}");
        assert_eq!(st.records, 50);
        assert_eq!(st.written + st.limited + st.dropped, 50);
        assert!(st.limited > 40, "{st:?}");
        assert_eq!(st.max_bytes, 300);
        let dev = &rig.status().devices[0];
        assert!(dev.trace.file_full && !dev.trace.running);
    }

    #[test]
    fn follow_streams_live_lines_until_the_client_goes() {
        let rig = Rig::new("follow", false, Limits::default());
        let ctl = rig.ctl.clone();
        let got = std::thread::spawn(move || {
            let mut lines = Vec::new();
            follow_trace(&ctl, "g", |l| {
                lines.push(l.to_string());
                lines.len() < 3
            })
            .unwrap();
            lines
        });
        let mut c = rig.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !got.is_finished() {
            assert!(Instant::now() < deadline, "no lines followed");
            read0(&mut c, 0);
            std::thread::sleep(Duration::from_millis(20));
        }
        let lines = got.join().unwrap();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.contains("FAKE_STATUS")), "{lines:?}");
        // The server notices the follower left; tracing stops with it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while rig.status().devices[0].trace.followers > 0 {
            assert!(Instant::now() < deadline, "follower never noticed gone");
            read0(&mut c, 0);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!rig.handle.is_tracing());
        // A follow of a port that is not a device is refused.
        let e = follow_trace(&rig.ctl, "v", |_| true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "daemon refused: port v is a virtio-net port: device traces need kind=gve or kind=erdma"
        );
    }
}

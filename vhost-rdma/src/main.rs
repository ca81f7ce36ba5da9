//! `vhost-rdma`: the daemon (`serve`) and its control client (`ctl`).

mod cli;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use vhost_rdma::config::{DaemonConfig, HostSpec, PortConfig};
use vhost_rdma::control::{request, Request};
use vhost_rdma::Server;

#[derive(Parser)]
#[command(
    name = "vhost-rdma",
    version,
    about = "vhost-user virtio-net fabric for RDMA/SMC-R testing with unmodified guests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve ports until SIGINT/SIGTERM; removes the sockets on exit.
    Serve {
        /// NAME=SOCKET_PATH[,mac=MAC][,queues=N][,form=pci|testdev][,kind=gve|erdma][,rx-queue-frames=N];
        /// uplinks: NAME,kind=vxlan,local=IP:PORT,remote=IP:PORT[,remote=...][,vni=N][,mtu=N]
        /// (VNI 1 and underlay MTU 1500 unless given) or NAME,kind=tap,ifname=IF (docs/uplinks.md)
        #[arg(long = "port", value_name = "SPEC")]
        ports: Vec<PortConfig>,
        /// Virtual host on the fabric running RDMA tool services:
        /// NAME=IP/PREFIX[,mac=MAC][,service=KIND[@PEER]]...[,max-qps=N][,max-mrs=N][,max-tcp=N];
        /// KIND: pingpong-server, pingpong-client, {write,send,read,atomic}-bw-server,
        /// {write,send,read,atomic}-bw-client, rping-server, rping-client,
        /// ucmatose-server, ucmatose-client (README "Virtual hosts")
        #[arg(long = "host", value_name = "SPEC")]
        hosts: Vec<HostSpec>,
        /// TOML configuration file (ports from flags are added to it).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Control socket for `vhost-rdma ctl`. Whoever can connect to it
        /// acts with the daemon's rights (faults, captures, hosts); it is
        /// created owner-only (mode 0600).
        #[arg(long)]
        control: Option<PathBuf>,
        /// The only directory `ctl capture start` may create files in (new
        /// files only, no symlinks followed); default
        /// $XDG_RUNTIME_DIR/vhost-rdma/captures, /run/vhost-rdma/captures for
        /// root.
        #[arg(long, value_name = "DIR")]
        capture_dir: Option<PathBuf>,
    },
    /// Talk to a running daemon through its control socket.
    ///
    /// The control socket is as powerful as the daemon's user: whoever can
    /// connect can reconfigure the fabric, inject faults and create capture
    /// files (in the capture directory only). The daemon creates it
    /// owner-only (mode 0600).
    Ctl {
        /// The daemon's control socket [default: $VHOST_RDMA_CONTROL, else
        /// ctl.sock in the runtime directory: $XDG_RUNTIME_DIR/vhost-rdma,
        /// /run/vhost-rdma for root]. Accepted anywhere on the line.
        #[arg(long, global = true, value_name = "SOCKET")]
        control: Option<PathBuf>,
        /// Print JSON instead of a table. Accepted anywhere on the line.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        cmd: CtlCmd,
    },
}

#[derive(Subcommand)]
enum CtlCmd {
    /// Ports, negotiated features, queues and counters.
    Status,
    /// Flow steering rules of a port (applied before RSS).
    FlowRule {
        #[command(subcommand)]
        op: cli::steering::FlowRuleCmd,
    },
    /// RSS state of a port: key, indirection table, hash types, per-queue
    /// steering counters, flows seen; --predict shows where a flow goes.
    Rss(cli::steering::RssArgs),
    /// Fault injection rules: add, list (with counters), del.
    Faults {
        #[command(subcommand)]
        op: cli::faults::FaultsCmd,
    },
    /// Take a port's link down (frames to and from it dropped, counted) or up.
    Link {
        state: cli::faults::LinkState,
        #[arg(long)]
        port: String,
    },
    /// pcapng captures of one port or the whole fabric.
    Capture {
        #[command(subcommand)]
        op: cli::faults::CaptureCmd,
    },
    /// RoCE queue-pair connections, iWARP connections and SMC-R links seen
    /// by the protocol checker, with their state (PSNs, reads, MSNs, cursors).
    Flows,
    /// Protocol rule violations found by the checker.
    Findings {
        /// Forget the findings after showing them.
        #[arg(long)]
        clear: bool,
    },
    /// Checker counters; `on` / `off` switches it.
    Checker { state: Option<cli::checker::OnOff> },
    /// Virtual hosts: services, counters and recent events.
    Hosts,
    /// Start or stop a service on a virtual host.
    Host {
        /// The host's name.
        name: String,
        #[command(subcommand)]
        op: HostOp,
    },
}

#[derive(Subcommand)]
enum HostOp {
    /// Start a service, e.g. `pingpong-client --peer 10.77.0.1` to run
    /// ibv_rc_pingpong's client role against a guest's server.
    Start {
        /// pingpong-server, pingpong-client, {write,send,read,atomic}-bw-server,
        /// {write,send,read,atomic}-bw-client, rping-server, rping-client,
        /// ucmatose-server or ucmatose-client.
        kind: String,
        /// The guest to connect to (client services).
        #[arg(long)]
        peer: Option<std::net::Ipv4Addr>,
        /// TCP port of the tool's exchange (default: the tool's).
        #[arg(long)]
        port: Option<u16>,
        /// Message size (the tool's -s).
        #[arg(long)]
        size: Option<u32>,
        /// Iterations (the tool's -n).
        #[arg(long)]
        iters: Option<u32>,
        /// Receives posted at a time (the tool's -r).
        #[arg(long)]
        rx_depth: Option<u32>,
        /// Path MTU (the tool's -m).
        #[arg(long)]
        mtu: Option<u32>,
        /// Seconds a client keeps retrying while the guest's server is not up.
        #[arg(long)]
        connect_timeout: Option<u64>,
        /// iWARP services (rping-*, ucmatose-*, *-bw-* with --rdma-cm): ask
        /// for MPA CRC.
        #[arg(long)]
        mpa_crc: bool,
        /// perftest services ({write,send,read}-bw-*): the tool runs with -R
        /// (rdma_cm over iWARP, a siw guest; with --roce over RoCE, an rxe
        /// guest) instead of its TCP exchange.
        #[arg(long)]
        rdma_cm: bool,
        /// With --rdma-cm: rdma_cm over RoCE (an rxe guest: IB CM, RC QPs)
        /// instead of iWARP.
        #[arg(long, requires = "rdma_cm")]
        roce: bool,
        /// Behave like the tool itself (echo what arrives, check nothing);
        /// for one virtual host against another.
        #[arg(long)]
        echo: bool,
    },
    /// Stop a service by id.
    Stop { id: u32 },
}

fn main() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VHOST_RDMA_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        // Colour only for a terminal (and never with NO_COLOR): logs that
        // go to a file or a pipe stay plain text.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr)
        .init();
    // One clear line and exit status 1 for every error, whatever
    // RUST_BACKTRACE says: errors here are the user's to fix, not crashes.
    if let Err(e) = run(Cli::parse()) {
        eprintln!("vhost-rdma: {e:#}");
        std::process::exit(1);
    }
}

/// The control socket `ctl` talks to: `--control`, else
/// `$VHOST_RDMA_CONTROL`, else `ctl.sock` in the runtime directory.
fn control_socket(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("VHOST_RDMA_CONTROL")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| vhost_rdma::capture::runtime_dir().join("ctl.sock"))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Serve {
            ports,
            hosts,
            config,
            control,
            capture_dir,
        } => serve(ports, hosts, config, control, capture_dir),
        Cmd::Ctl { control, json, cmd } => {
            // A reader that goes away (`ctl ... | head`) ends us quietly, as
            // it would any Unix tool, instead of a failed print.
            // SAFETY: resetting a signal's disposition to its default.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            ctl(&control_socket(control), json, cmd)
        }
    }
}

fn serve(
    ports: Vec<PortConfig>,
    hosts: Vec<HostSpec>,
    config: Option<PathBuf>,
    control: Option<PathBuf>,
    capture_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut cfg = match &config {
        Some(p) => DaemonConfig::from_file(p)?,
        None => DaemonConfig::default(),
    };
    cfg.ports.extend(ports);
    cfg.hosts.extend(hosts);
    if control.is_some() {
        cfg.control = control;
    }
    if capture_dir.is_some() {
        cfg.capture_dir = capture_dir;
    }
    // Block the signals in every thread; the main thread waits for them.
    let set = signal_set();
    // SAFETY: plain libc calls on a valid, initialised sigset.
    unsafe {
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            bail!("cannot block signals");
        }
    }
    let server = Server::start(cfg.clone()).context("starting the daemon")?;
    // As started (an erdma port has taken its netdev's MAC by now).
    for p in server.stats().iter().filter(|p| p.form != "host") {
        tracing::info!(port = %p.name, socket = %p.socket, mac = %p.mac, queues = p.queue_pairs, form = %p.form, "port ready");
    }
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised and `sig` is a valid out pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    tracing::info!(signal = sig, "shutting down");
    server.shutdown()
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

fn ctl(control: &std::path::Path, json: bool, cmd: CtlCmd) -> anyhow::Result<()> {
    match cmd {
        CtlCmd::FlowRule { op } => cli::steering::flow_rule(control, json, op),
        CtlCmd::Rss(a) => cli::steering::rss(control, json, a),
        CtlCmd::Faults { op } => cli::faults::faults(control, json, op),
        CtlCmd::Link { state, port } => cli::faults::link(control, json, port, state),
        CtlCmd::Capture { op } => cli::faults::capture(control, json, op),
        CtlCmd::Flows => cli::checker::flows(control, json),
        CtlCmd::Findings { clear } => cli::checker::findings(control, json, clear),
        CtlCmd::Checker { state } => cli::checker::checker(
            control,
            json,
            state.map(|s| matches!(s, cli::checker::OnOff::On)),
        ),
        CtlCmd::Hosts => {
            let r = request(control, &Request::Hosts)?;
            if !r.ok {
                bail!("daemon refused: {}", r.error.unwrap_or_default());
            }
            let hosts = r.hosts.unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&hosts)?);
            } else {
                print_hosts(&hosts);
            }
            Ok(())
        }
        CtlCmd::Host { name, op } => {
            let req = match op {
                HostOp::Start {
                    kind,
                    peer,
                    port,
                    size,
                    iters,
                    rx_depth,
                    mtu,
                    connect_timeout,
                    mpa_crc,
                    rdma_cm,
                    roce,
                    echo,
                } => Request::HostStart {
                    host: name.clone(),
                    service: vhost_rdma::hosts::ServiceRequest {
                        kind,
                        peer,
                        port,
                        size,
                        iters,
                        rx_depth,
                        mtu,
                        connect_timeout_secs: connect_timeout,
                        mpa_crc: mpa_crc.then_some(true),
                        rdma_cm: rdma_cm.then_some(true),
                        roce: roce.then_some(true),
                        echo,
                    },
                },
                HostOp::Stop { id } => Request::HostStop {
                    host: name.clone(),
                    id,
                },
            };
            let r = request(control, &req)?;
            if !r.ok {
                bail!("daemon refused: {}", r.error.unwrap_or_default());
            }
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else if let Some(id) = r.service_id {
                println!("host {name}: service {id} started");
            } else {
                println!("ok");
            }
            Ok(())
        }
        CtlCmd::Status => {
            let r = request(control, &Request::Status)?;
            if !r.ok {
                bail!("daemon refused: {}", r.error.unwrap_or_default());
            }
            let s = r.status.context("reply without status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(());
            }
            println!(
                "{:<10} {:<9} {:<8} {:<17} {:>3} {:>12} {:>14} {:>12} {:>14} {:>8} {:>8}",
                "port",
                "connected",
                "form",
                "mac",
                "qps",
                "tx_frames",
                "tx_bytes",
                "rx_frames",
                "rx_bytes",
                "drops",
                "errors"
            );
            for p in s.ports {
                println!(
                    "{:<10} {:<9} {:<8} {:<17} {:>1}/{:<1} {:>12} {:>14} {:>12} {:>14} {:>8} {:>8}",
                    p.name,
                    if p.connected { "yes" } else { "no" },
                    p.form,
                    p.mac,
                    p.active_queue_pairs,
                    p.queue_pairs,
                    p.tx_frames,
                    p.tx_bytes,
                    p.rx_frames,
                    p.rx_bytes,
                    p.rx_drops,
                    p.tx_errors + p.rx_errors + p.ctrl_errors
                );
            }
            if let Some(c) = &s.checker {
                cli::checker::print_status(c);
            }
            if !s.hosts.is_empty() {
                println!();
                print_hosts(&s.hosts);
            }
            for d in &s.devices {
                println!();
                print_device(d);
            }
            for u in &s.uplinks {
                println!();
                print_uplink(u);
            }
            Ok(())
        }
    }
}

fn print_uplink(u: &vhost_rdma::uplink::UplinkStatus) {
    if let Some(v) = &u.vxlan {
        let c = &v.counters;
        println!(
            "uplink {} (vxlan): local {} remotes {} vni {}, underlay MTU {} (inner frames up to {} bytes)",
            u.port,
            v.local,
            v.remotes.join(","),
            v.vni,
            v.underlay_mtu,
            v.max_inner_frame
        );
        println!(
            "  tx {} datagrams (oversized {}, send errors {}), rx {} datagrams (unknown source {}, short {}, bad flags {}, wrong vni {}, oversized {}), {} MACs learned",
            c.tx_datagrams,
            c.tx_oversized,
            c.tx_send_errors,
            c.rx_datagrams,
            c.rx_unknown_source,
            c.rx_short,
            c.rx_bad_flags,
            c.rx_wrong_vni,
            c.rx_oversized,
            c.learned
        );
    }
    if let Some(t) = &u.tap {
        println!(
            "uplink {} (tap): ifname {}, write errors {}, read errors {}, short frames {}",
            u.port, t.ifname, t.write_errors, t.read_errors, t.short
        );
    }
}

fn print_device(d: &vhost_rdma::device_port::DeviceStatus) {
    use vhost_rdma::device_port::DeviceDetail;
    let g = match &d.detail {
        DeviceDetail::Gve(g) => g,
        DeviceDetail::Erdma(e) => {
            let c = &e.counters;
            println!(
                "device {} (erdma): status register {:#x}, {} DMA regions, path MTU {}",
                d.port, e.status_register, d.dma_regions, e.path_mtu
            );
            println!("  {c:?}");
            return;
        }
    };
    let c = &g.counters;
    println!(
        "device {} ({}): driver {:?}, {} DMA regions, mtu {}, admin commands {} ok {} failed",
        d.port, d.kind, g.driver_version, d.dma_regions, g.mtu, c.admin_ok, c.admin_failed
    );
    println!(
        "  rx {} frames {} bytes (drops {}, no buffers {}, csum errors {}), tx {} frames {} bytes; rss {} rule {} steered",
        c.rx_packets,
        c.rx_bytes,
        c.rx_drops,
        c.rx_no_buffers,
        c.rx_csum_errors,
        c.tx_packets,
        c.tx_bytes,
        c.rss_steered,
        c.flow_rule_hits
    );
    for q in &g.rx_queues {
        let qc = c.rx_queues.get(q.id as usize).copied().unwrap_or_default();
        println!(
            "  rx queue {}: header split {} (header buffer {} B), buffers posted {}, packets {}, split {}, header bytes {}, payload bytes {}",
            q.id,
            if q.header_buffer_size > 0 { "on" } else { "off" },
            q.header_buffer_size,
            q.buffers_available,
            qc.packets,
            qc.hsplit_packets,
            qc.header_bytes,
            qc.payload_bytes
        );
    }
    for q in &g.tx_queues {
        let qc = c.tx_queues.get(q.id as usize).copied().unwrap_or_default();
        println!(
            "  tx queue {}: packets {}, tso {}",
            q.id, qc.packets, qc.tso_packets
        );
    }
    println!(
        "  rss: hash types {:#x}, table {} entries{}",
        g.rss.hash_types,
        g.rss.indirection_table.len(),
        if g.rss.table_configured {
            " (set by the driver)"
        } else {
            " (device default)"
        }
    );
    for r in &g.flow_rules {
        println!(
            "  flow rule {}: {} -> queue {} ({} hits)",
            r.location, r.description, r.queue, r.hits
        );
    }
}

fn print_hosts(hosts: &[vhost_rdma::hosts::HostStats]) {
    for h in hosts {
        println!(
            "host {} {} mac {}: rx {} tx {} frames, roce rx {} tx {} (icrc errors {}, malformed {}, no qp {}, dropped {}), qps {} mrs {} tcp {}",
            h.name,
            h.address,
            h.mac,
            h.rx_frames,
            h.tx_frames,
            h.roce_rx,
            h.roce_tx,
            h.roce_icrc_errors,
            h.roce_malformed,
            h.roce_no_qp,
            h.roce_dropped,
            h.qps,
            h.mrs,
            h.tcp_sockets
        );
        let i = &h.iwarp;
        if *i != Default::default() {
            println!(
                "  iwarp: connected {} (crc {}), mpa errors {}, crc errors {}, terminates sent {} received {}, setup timeouts {}, streams lost {}",
                i.connected,
                i.connected_crc,
                i.mpa_errors,
                i.crc_errors,
                i.terminates_sent,
                i.terminates_received,
                i.setup_timeouts,
                i.streams_lost
            );
        }
        let c = &h.cm;
        if *c != Default::default() {
            println!(
                "  cm (RoCE, QP1): MADs rx {} tx {} bad {} bad-qkey {}, established {}, unknown service {}, limit rejects {}, REJ sent {} received {}, retransmits {}, timeouts {}",
                c.mads_rx,
                c.mads_tx,
                c.bad_mads,
                c.bad_qkey,
                c.established,
                c.unknown_service,
                c.limit_rejects,
                c.rejects_sent,
                c.rejects_received,
                c.retransmits,
                c.timeouts
            );
        }
        for s in &h.services {
            println!(
                "  service {} {} port {} peer {} state {} (sent {} received {}): sessions ok {} failed {}, last {} iterations ({} verified){}",
                s.id,
                s.kind,
                s.port,
                s.peer.as_deref().unwrap_or("-"),
                s.state,
                s.sent,
                s.received,
                s.sessions_ok,
                s.sessions_failed,
                s.last_iterations,
                s.last_verified,
                s.last_error
                    .as_ref()
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            );
        }
        for e in &h.events {
            println!("  event: {e}");
        }
    }
}

//! `vhost-rdma`: the daemon (`serve`, also the default when QEMU's backend
//! options are given without a subcommand), its control client (`ctl`) and
//! `generate` (man page, shell completions).

mod cli;

use anyhow::{bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand};
use std::path::{Path, PathBuf};
use vhost_rdma::activation::ListenFd;
use vhost_rdma::config::{DaemonConfig, HostSpec, PortConfig};
use vhost_rdma::control::{request, Request};
use vhost_rdma::socket_path::{resolve_group, resolve_user, SocketPerms};
use vhost_rdma::Server;

#[derive(Parser)]
#[command(
    name = "vhost-rdma",
    version,
    about = "vhost-user virtio-net fabric for RDMA/SMC-R testing with unmodified guests",
    long_about = "vhost-user virtio-net fabric for RDMA/SMC-R testing with unmodified guests.\n\n\
        `vhost-rdma serve` runs the daemon; `vhost-rdma ctl` talks to it. Without a \
        subcommand the serve options apply, so QEMU's backend program conventions \
        work: `vhost-rdma --print-capabilities`, `vhost-rdma --socket-path PATH`, \
        `vhost-rdma --fd N`.",
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve ports until SIGINT/SIGTERM; removes the sockets it bound on exit.
    ///
    /// Under systemd socket activation (LISTEN_PID is ours, LISTEN_FDS >= 1)
    /// the passed sockets (descriptors 3, 4, ...) serve virtio-net ports: one
    /// named in LISTEN_FDNAMES (FileDescriptorName=) like a port goes to that
    /// port, the others to the remaining ports in order; with no --port at
    /// all each socket becomes a port of its own (named after it, else
    /// net0, net1, ...). Inherited sockets and their paths stay systemd's.
    Serve(ServeArgs),
    /// Talk to a running daemon through its control socket.
    ///
    /// The control socket is as powerful as the daemon's user: whoever can
    /// connect can reconfigure the fabric, inject faults and create capture
    /// files (in the capture directory only). The daemon creates it
    /// owner-only (mode 0600).
    ///
    /// Without --control, --pid or $VHOST_RDMA_CONTROL, `ctl` looks for
    /// running daemons in the runtime directory ($XDG_RUNTIME_DIR/vhost-rdma,
    /// /run/vhost-rdma for root, /tmp/vhost-rdma-UID otherwise): with one
    /// it talks to that one; with several it lists them (pid, control
    /// socket, ports) and asks for --pid or --control.
    Ctl {
        /// The daemon's control socket [default: $VHOST_RDMA_CONTROL, else
        /// the one daemon running in the runtime directory]. Accepted
        /// anywhere on the line.
        #[arg(long, global = true, value_name = "SOCKET")]
        control: Option<PathBuf>,
        /// Talk to the daemon with this process id, one listening on a
        /// control socket in the runtime directory (or on
        /// $VHOST_RDMA_CONTROL). Accepted anywhere on the line.
        #[arg(long, global = true, value_name = "PID", conflicts_with = "control")]
        pid: Option<u32>,
        /// Print JSON instead of a table. Accepted anywhere on the line.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        cmd: CtlCmd,
    },
    /// Check a capture after the fact: every whole Ethernet frame of a pcapng
    /// (the daemon's `ctl capture`) or pcap goes through the protocol checker
    /// (docs/checker.md), with its interface's name as the port.
    ///
    /// Prints the interfaces, the RoCE, iWARP and SMC flows, the TCP
    /// connections it could not follow and the findings. A frame recorded on
    /// two ports (the sender's and the receiver's) is compared with its first
    /// sighting byte by byte, as a TCP retransmission is
    /// (`retransmit-differs`). Exit status 0 when clean, 1 on any finding or
    /// problem, 2 when the file cannot be read.
    CheckCapture(cli::check_capture::CheckCaptureArgs),
    /// Write the man pages or shell completions generated from this command
    /// line's definitions.
    Generate {
        #[command(subcommand)]
        what: GenerateCmd,
    },
}

/// `serve`'s options (also accepted without the subcommand).
#[derive(Args, Clone, Debug, Default)]
struct ServeArgs {
    /// NAME=SOCKET_PATH[,mac=MAC][,queues=N][,form=pci|testdev][,kind=virtio-net|gve|erdma][,netdev=PORT][,rx-queue-frames=N]
    /// (queues: 1, kind=gve 2, the least devmem TCP needs);
    /// uplinks: NAME,kind=vxlan,local=IP:PORT,remote=IP:PORT[,remote=...][,vni=N][,mtu=N][,df=set|unset]
    /// (VNI 1, underlay MTU 1500 and df=unset unless given) or NAME,kind=tap,ifname=IF (docs/uplinks.md)
    #[arg(long = "port", value_name = "SPEC")]
    ports: Vec<PortConfig>,
    /// Virtual host on the fabric running RDMA tool services (--help lists
    /// the service kinds).
    #[arg(long = "host", value_name = "SPEC", long_help = host_long_help())]
    hosts: Vec<HostSpec>,
    /// TOML configuration file (ports from flags are added to it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Control socket for `vhost-rdma ctl` [default: the config file's
    /// `control`, else $VHOST_RDMA_CONTROL (when another daemon serves it,
    /// this one uses its own, with a warning), else this daemon's own,
    /// ctl/PID.sock in the runtime directory ($XDG_RUNTIME_DIR/vhost-rdma,
    /// /run/vhost-rdma for root, /tmp/vhost-rdma-UID otherwise), where
    /// `ctl` finds it]. A path given here or in the config file that a
    /// running process serves stops the daemon. Whoever can connect to it
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
    /// Print this vhost-user backend's capabilities as JSON
    /// (`{"type":"net","features":[]}`) and exit (QEMU's backend program
    /// conventions).
    #[arg(long)]
    print_capabilities: bool,
    /// Serve one port, net0, at PATH (QEMU's backend program conventions;
    /// the same as --port net0=PATH).
    #[arg(long, value_name = "PATH", conflicts_with = "fd")]
    socket_path: Option<PathBuf>,
    /// Serve one port, net0, on FD: a Unix stream socket the caller already
    /// bound and listens on, inherited open (QEMU's backend program
    /// conventions). Its path is left to the caller.
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(0..))]
    fd: Option<i32>,
    /// Permission bits of every port socket the daemon binds, octal (e.g.
    /// 0660 so that QEMU in --socket-group can connect).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    socket_mode: Option<u32>,
    /// Owner (name or uid) of every port socket the daemon binds.
    #[arg(long, value_name = "USER")]
    socket_user: Option<String>,
    /// Group (name or gid) of every port socket the daemon binds (e.g. kvm).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Run the daemon's threads on these CPUs only, as `taskset -c` takes
    /// them (e.g. 1 or 2-3): on a host whose CPUs the guests share, a switch
    /// kept on one CPU needs about half the CPU per frame [default: the
    /// config file's `cpu-affinity`, else no pinning].
    #[arg(long, value_name = "CPUS")]
    cpu_affinity: Option<vhost_rdma::affinity::CpuList>,
}

/// `generate` subcommands.
#[derive(Subcommand)]
enum GenerateCmd {
    /// Write vhost-rdma.1 and one page per subcommand (vhost-rdma-ctl.1, ...)
    /// into DIR.
    Man {
        /// The directory (created if missing).
        dir: PathBuf,
    },
    /// Print the completion script for SHELL.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// An octal permission mode such as 0660 or 660.
fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode such as 0660")),
    }
}

/// `--host`'s long help, listing every service kind the virtual host knows
/// (generated, so it cannot fall behind).
fn host_long_help() -> String {
    let kinds: Vec<String> = virtual_host::ServiceKind::ALL
        .iter()
        .map(|k| k.to_string())
        .collect();
    format!(
        "Virtual host on the fabric running RDMA tool services:\n\
         NAME=IP/PREFIX[,mac=MAC][,service=KIND[@PEER]]...[,max-qps=N][,max-mrs=N][,max-tcp=N]\n\n\
         KIND: {} (docs/virtual-hosts.md)",
        kinds.join(", ")
    )
}

/// Values of `ctl host NAME start KIND`: every service kind.
fn service_kind_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        virtual_host::ServiceKind::ALL
            .iter()
            .map(|k| clap::builder::PossibleValue::new(k.to_string())),
    )
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
    /// Take a port's link down (frames to and from it dropped, counted) or
    /// up; on a gve or erdma port the device also shows it to its driver.
    Link {
        /// The new state.
        state: cli::faults::LinkState,
        /// The port.
        #[arg(long)]
        port: String,
    },
    /// Device faults of gve and erdma ports (the driver bench): add, list
    /// (with matched/hits), clear, kinds.
    DeviceFault {
        #[command(subcommand)]
        op: cli::bench::DeviceFaultCmd,
    },
    /// The device trace of a gve or erdma port: register accesses (named),
    /// commands, completions, events, interrupts, DMA, resets, faults.
    /// `start`, `stop`, `show`, or `--follow --port NAME`.
    Trace(cli::bench::TraceArgs),
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
    Checker {
        /// Switch the checker on or off (default: only show its counters).
        state: Option<cli::checker::OnOff>,
    },
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
    Start(StartArgs),
    /// Stop a service by id.
    Stop {
        /// The service's id (`ctl hosts`).
        id: u32,
    },
}

/// What `ctl host NAME start` asks the host for.
#[derive(Args)]
struct StartArgs {
    /// The service kind (tool and role).
    #[arg(value_parser = service_kind_parser())]
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
}

impl StartArgs {
    /// The control socket's request for this service.
    fn into_request(self) -> vhost_rdma::ports::host::ServiceRequest {
        vhost_rdma::ports::host::ServiceRequest {
            kind: self.kind,
            peer: self.peer,
            port: self.port,
            size: self.size,
            iters: self.iters,
            rx_depth: self.rx_depth,
            mtu: self.mtu,
            connect_timeout_secs: self.connect_timeout,
            mpa_crc: self.mpa_crc.then_some(true),
            rdma_cm: self.rdma_cm.then_some(true),
            roce: self.roce.then_some(true),
            echo: self.echo,
        }
    }
}

fn main() {
    use std::io::IsTerminal;
    // First, while no other thread runs: the environment changes.
    let inherited = vhost_rdma::activation::take_from_env();
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
    // Usage errors exit inside parse() with clap's status 2. The rest are
    // the user's to fix, not crashes: one line and status 1, whatever
    // RUST_BACKTRACE says.
    if let Err(e) = run(Cli::parse(), inherited) {
        eprintln!("vhost-rdma: error: {e:#}");
        std::process::exit(1);
    }
}

/// `$VHOST_RDMA_CONTROL`, when set and not empty.
fn control_from_env() -> Option<PathBuf> {
    std::env::var_os("VHOST_RDMA_CONTROL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The control socket `ctl` talks to: `--control`, else the daemon with
/// `--pid`, else `$VHOST_RDMA_CONTROL`, else the one daemon running in the
/// runtime directory. Never a guess between several.
fn ctl_control(control: Option<PathBuf>, pid: Option<u32>) -> anyhow::Result<PathBuf> {
    use vhost_rdma::control::discovery::choose;
    let runtime = vhost_rdma::capture::runtime_dir();
    let env = control_from_env();
    match (control, pid, env) {
        (Some(path), _, _) => Ok(path),
        (None, Some(pid), env) => Ok(choose(&runtime, env.as_deref(), Some(pid))?),
        (None, None, Some(path)) => Ok(path),
        (None, None, None) => Ok(choose(&runtime, None, None)?),
    }
}

fn run(cli: Cli, inherited: Vec<ListenFd>) -> anyhow::Result<()> {
    match cli.cmd {
        None => serve(cli.serve, inherited),
        Some(Cmd::Serve(a)) => serve(a, inherited),
        Some(Cmd::Ctl {
            control,
            pid,
            json,
            cmd,
        }) => {
            default_sigpipe();
            ctl(&ctl_control(control, pid)?, json, cmd)
        }
        Some(Cmd::CheckCapture(a)) => {
            default_sigpipe();
            std::process::exit(cli::check_capture::run(&a))
        }
        Some(Cmd::Generate { what }) => {
            default_sigpipe();
            generate(what, &mut std::io::stdout())
        }
    }
}

/// A reader that goes away (`ctl ... | head`) ends us quietly, as it would
/// any Unix tool, instead of a failed print.
fn default_sigpipe() {
    // SAFETY: resetting a signal's disposition to its default.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn generate(what: GenerateCmd, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    match what {
        GenerateCmd::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
        GenerateCmd::Completions { shell } => {
            clap_complete::generate(shell, &mut cmd, "vhost-rdma", out);
        }
    }
    Ok(())
}

/// What `--print-capabilities` prints (`VHostUserBackendCapabilities` in
/// QEMU's vhost-user.json): type first, as QEMU's examples show it. The
/// schema defines no features for type "net", so the list is empty.
#[derive(serde::Serialize)]
struct Capabilities {
    r#type: &'static str,
    features: [&'static str; 0],
}

const CAPABILITIES: Capabilities = Capabilities {
    r#type: "net",
    features: [],
};

fn serve(a: ServeArgs, inherited: Vec<ListenFd>) -> anyhow::Result<()> {
    if a.print_capabilities {
        println!("{}", serde_json::to_string(&CAPABILITIES)?);
        return Ok(());
    }
    let mut cfg = match &a.config {
        Some(p) => DaemonConfig::from_file(p)?,
        None => DaemonConfig::default(),
    };
    cfg.ports.extend(a.ports);
    if let Some(p) = a.socket_path {
        cfg.ports.push(PortConfig::new("net0", p));
    }
    if let Some(fd) = a.fd {
        cfg.ports.push(PortConfig::from_fd("net0", fd));
    }
    cfg.adopt_listen_fds(&inherited)
        .context("systemd socket activation")?;
    cfg.hosts.extend(a.hosts);
    cfg.socket_perms = SocketPerms {
        mode: a.socket_mode,
        uid: a.socket_user.as_deref().map(resolve_user).transpose()?,
        gid: a.socket_group.as_deref().map(resolve_group).transpose()?,
    };
    if a.control.is_some() {
        cfg.control = a.control;
    } else if cfg.control.is_none() {
        let runtime = vhost_rdma::capture::runtime_dir();
        let own = vhost_rdma::control::discovery::instance_socket(&runtime, std::process::id());
        // Sockets of daemons that were killed would otherwise pile up
        // there; whether they go changes nothing else.
        if let Some(dir) = own.parent() {
            if let Err(e) = vhost_rdma::socket_path::remove_stale_sockets(dir) {
                tracing::debug!(dir = %dir.display(), error = %e, "stale control sockets not removed");
            }
        }
        match control_from_env() {
            Some(shared) => {
                cfg.control = Some(shared);
                cfg.control_fallback = Some(own);
            }
            None => cfg.control = Some(own),
        }
    }
    if a.capture_dir.is_some() {
        cfg.capture_dir = a.capture_dir;
    }
    if a.cpu_affinity.is_some() {
        cfg.cpu_affinity = a.cpu_affinity;
    }
    if let Some(cpus) = &cfg.cpu_affinity {
        // Before any worker starts: they inherit it.
        let refused = cpus.pin_process().context("--cpu-affinity")?;
        if !refused.is_empty() {
            tracing::warn!(cpus = ?refused, "CPUs of --cpu-affinity this process may not use are left out");
        }
        tracing::info!(cpus = %cpus, "threads pinned");
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

fn ctl(control: &Path, json: bool, cmd: CtlCmd) -> anyhow::Result<()> {
    match cmd {
        CtlCmd::FlowRule { op } => cli::steering::flow_rule(control, json, op),
        CtlCmd::Rss(a) => cli::steering::rss(control, json, a),
        CtlCmd::Faults { op } => cli::faults::faults(control, json, op),
        CtlCmd::Link { state, port } => cli::faults::link(control, json, port, state),
        CtlCmd::Capture { op } => cli::faults::capture(control, json, op),
        CtlCmd::DeviceFault { op } => cli::bench::device_fault(control, json, op),
        CtlCmd::Trace(a) => cli::bench::trace(control, json, a),
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
            let hosts = r.into_hosts().unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&hosts)?);
            } else {
                print_hosts(&hosts);
            }
            Ok(())
        }
        CtlCmd::Host { name, op } => {
            let req = match op {
                HostOp::Start(args) => Request::HostStart {
                    host: name.clone(),
                    service: args.into_request(),
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
            } else if let Some(id) = r.service_id() {
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
            let s = r.into_status().context("reply without status")?;
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
            let stuck: Vec<String> = s
                .ports
                .iter()
                .filter_map(|p| p.stuck.as_ref().map(|r| r.text.clone()))
                .collect();
            for p in s.ports {
                println!(
                    "{:<10} {:<9} {:<8} {:<17} {:>1}/{:<1} {:>12} {:>14} {:>12} {:>14} {:>8} {:>8}",
                    p.name,
                    if p.connected { "yes" } else { "no" },
                    p.form,
                    p.mac,
                    p.active_queue_pairs,
                    p.queue_pairs,
                    p.totals.tx_frames,
                    p.totals.tx_bytes,
                    p.totals.rx_frames,
                    p.totals.rx_bytes,
                    p.totals.rx_drops,
                    p.totals.tx_errors + p.totals.rx_errors + p.ctrl_errors
                );
            }
            for text in stuck {
                println!("STUCK: {text}");
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

fn print_uplink(u: &vhost_rdma::ports::uplink::UplinkStatus) {
    use vhost_rdma::vxlan::DontFragment;
    if let Some(v) = &u.vxlan {
        let c = &v.counters;
        let sizes = match v.df {
            DontFragment::Set => format!("inner frames up to {} bytes", v.max_inner_frame),
            DontFragment::Unset => format!(
                "inner frames up to {} bytes unfragmented, {} fragmented",
                v.unfragmented_inner_frame, v.max_inner_frame
            ),
        };
        println!(
            "uplink {} (vxlan): local {} remotes {} vni {}, underlay MTU {}, df {} ({sizes})",
            u.port,
            v.local,
            v.remotes.join(","),
            v.vni,
            v.underlay_mtu,
            v.df,
        );
        println!(
            "  tx {} datagrams (over mtu {}, oversized {}, send errors {}), rx {} datagrams (unknown source {}, short {}, bad flags {}, wrong vni {}, oversized {}), {} MACs learned",
            c.tx_datagrams,
            c.tx_over_mtu,
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

fn print_pump(p: &vhost_rdma::ports::device::PumpStatus) {
    println!(
        "  pump: {} frames held for {} queues without buffers (at most {} a queue, {} dropped past it), {} model panics caught{}",
        p.held_frames,
        p.held_queues,
        p.held_limit,
        p.held_drops,
        p.panics,
        p.last_panic
            .as_deref()
            .map(|m| format!(" (last in {m})"))
            .unwrap_or_default()
    );
}

fn print_device(d: &vhost_rdma::ports::device::DeviceStatus) {
    use vhost_rdma::ports::device::DeviceDetail;
    let g = match &d.detail {
        DeviceDetail::Gve(g) => g,
        DeviceDetail::Erdma(e) => {
            let c = &e.counters;
            println!(
                "device {} (erdma): status register {:#x}, {} DMA regions, path MTU {}",
                d.port, e.status_register, d.dma_regions, e.path_mtu
            );
            println!("  {c:?}");
            print_pump(&d.pump);
            print_bench(d);
            return;
        }
    };
    let c = &g.counters;
    println!(
        "device {} ({}): driver {:?}, {} DMA regions, mtu {}, admin commands {} ok {} failed",
        d.port, d.kind, g.driver_version, d.dma_regions, g.mtu, c.admin_ok, c.admin_failed
    );
    println!(
        "  rx {} frames {} bytes (drops {}, no buffers {}, csum errors {}; {} coalesced of {} segments, {} of them TSO frames taken whole), tx {} frames {} bytes; rss {} rule {} steered",
        c.rx_packets,
        c.rx_bytes,
        c.rx_drops,
        c.rx_no_buffers,
        c.rx_csum_errors,
        c.rx_rsc_packets,
        c.rx_rsc_segments,
        c.rx_tso_whole,
        c.tx_packets,
        c.tx_bytes,
        c.rss_steered,
        c.flow_rule_hits
    );
    print_pump(&d.pump);
    for q in &g.rx_queues {
        let qc = c.rx_queues.get(q.id as usize).copied().unwrap_or_default();
        println!(
            "  rx queue {}: header split {} (header buffer {} B), HW-GRO {}, buffers posted {}, packets {}, split {}, header bytes {}, payload bytes {}",
            q.id,
            if q.header_buffer_size > 0 { "on" } else { "off" },
            q.header_buffer_size,
            if q.rsc { "on" } else { "off" },
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
    print_bench(d);
}

/// A device port's fault rules and trace (the driver bench).
fn print_bench(d: &vhost_rdma::ports::device::DeviceStatus) {
    if !d.faults.is_empty() {
        println!("  device faults:");
        cli::bench::print_rules(&d.faults, "    ");
    }
    if d.trace.running || d.trace.records > 0 || d.trace.followers > 0 {
        cli::bench::print_trace(&d.trace, "  ");
    }
}

fn print_hosts(hosts: &[vhost_rdma::ports::host::HostStats]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand and argument below `cmd`, with its path, that has no
    /// help text.
    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            if a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!("{path} {}", a.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            let p = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                out.push(p.clone());
            }
            missing_help(sub, &p, out);
        }
    }

    #[test]
    fn every_argument_and_subcommand_has_help() {
        let mut cmd = Cli::command();
        // Builds the generated arguments (--help, --version) too.
        cmd.build();
        let mut missing = Vec::new();
        missing_help(&cmd, "vhost-rdma", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
        cmd.debug_assert();
    }

    fn long_help(args: &[&str]) -> String {
        let e = Cli::command()
            .try_get_matches_from(args)
            .expect_err("--help ends parsing");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        e.to_string()
    }

    #[test]
    fn help_lists_every_service_kind_and_fault_action() {
        let serve = long_help(&["vhost-rdma", "serve", "--help"]);
        let start = long_help(&["vhost-rdma", "ctl", "host", "h", "start", "--help"]);
        for k in virtual_host::ServiceKind::ALL {
            assert!(serve.contains(&k.to_string()), "serve --help lacks {k}");
            assert!(
                start.contains(&k.to_string()),
                "host start --help lacks {k}"
            );
        }
        let add = long_help(&["vhost-rdma", "ctl", "faults", "add", "--help"]);
        for a in vhost_rdma::faults::FaultAction::ALL {
            assert!(
                add.contains(&format!("{a}: ")),
                "faults add --help lacks {a}"
            );
        }
    }

    #[test]
    fn fault_actions_and_service_kinds_parse_as_listed() {
        use vhost_rdma::faults::FaultAction;
        let parse = |action: &str| {
            Cli::try_parse_from([
                "vhost-rdma",
                "ctl",
                "faults",
                "add",
                "--port",
                "a",
                "--action",
                action,
            ])
        };
        for a in FaultAction::ALL {
            let cli = parse(&a.to_string()).unwrap();
            let Some(Cmd::Ctl {
                cmd:
                    CtlCmd::Faults {
                        op: cli::faults::FaultsCmd::Add(args),
                    },
                ..
            }) = cli.cmd
            else {
                panic!("not faults add");
            };
            assert_eq!(args.action, a);
        }
        assert!(parse("duplicate").is_ok(), "alias refused");
        assert_eq!(
            parse("explode").err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::InvalidValue)
        );
        let bad = Cli::try_parse_from(["vhost-rdma", "ctl", "host", "h", "start", "ping"]);
        assert_eq!(
            bad.err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::InvalidValue)
        );
    }

    #[test]
    fn ctl_flags_anywhere_and_qemu_options_without_subcommand() {
        for args in [
            &["vhost-rdma", "ctl", "--json", "--control", "/c", "status"][..],
            &["vhost-rdma", "ctl", "status", "--json", "--control", "/c"],
            &[
                "vhost-rdma",
                "ctl",
                "faults",
                "--json",
                "list",
                "--control=/c",
            ],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let Some(Cmd::Ctl { control, json, .. }) = cli.cmd else {
                panic!("{args:?}: not ctl");
            };
            assert!(json, "{args:?}");
            assert_eq!(control, Some(PathBuf::from("/c")), "{args:?}");
        }
        let cli = Cli::try_parse_from(["vhost-rdma", "ctl", "status", "--pid", "42"]).unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Ctl { pid: Some(42), .. })));
        // One way to choose the daemon: both is a usage error, not a guess.
        let both = [
            "vhost-rdma",
            "ctl",
            "--pid",
            "42",
            "--control",
            "/c",
            "status",
        ];
        assert_eq!(
            Cli::try_parse_from(both).err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::ArgumentConflict)
        );
        let cli = Cli::try_parse_from(["vhost-rdma", "--socket-path", "/s.sock"]).unwrap();
        assert!(cli.cmd.is_none());
        assert_eq!(cli.serve.socket_path, Some(PathBuf::from("/s.sock")));
        let cli = Cli::try_parse_from(["vhost-rdma", "serve", "--fd", "3"]).unwrap();
        assert!(matches!(
            cli.cmd,
            Some(Cmd::Serve(ServeArgs { fd: Some(3), .. }))
        ));
        assert!(Cli::try_parse_from(["vhost-rdma", "--fd", "3", "--socket-path", "/s"]).is_err());
        assert!(
            Cli::try_parse_from(["vhost-rdma", "--socket-path", "/s", "ctl", "status"]).is_err()
        );
    }

    #[test]
    fn socket_mode_is_octal() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("77777").is_err());
    }

    #[test]
    fn capabilities_follow_qemus_schema() {
        let text = serde_json::to_string(&CAPABILITIES).unwrap();
        assert_eq!(text, r#"{"type":"net","features":[]}"#);
    }

    #[test]
    fn man_pages_and_completions_generate() {
        let dir = std::env::temp_dir().join(format!("vhr-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        generate(GenerateCmd::Man { dir: dir.clone() }, &mut std::io::sink()).unwrap();
        let page = std::fs::read_to_string(dir.join("vhost-rdma.1")).unwrap();
        assert!(page.contains(".TH vhost-rdma"), "{page}");
        assert!(page.contains("print\\-capabilities"), "{page}");
        assert!(dir.join("vhost-rdma-ctl.1").exists());
        let _ = std::fs::remove_dir_all(&dir);
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            generate(GenerateCmd::Completions { shell }, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains("print-capabilities"), "{shell}");
            // fish's generator stops above `ctl faults add`.
            if shell != clap_complete::Shell::Fish {
                assert!(
                    text.contains("mpa-settle"),
                    "{shell}: fault actions missing"
                );
            }
        }
    }
}

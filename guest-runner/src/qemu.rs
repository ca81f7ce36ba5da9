//! QEMU facts (version, devices) and the guests' QEMU command lines.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::options::BootOptions;
use crate::spec::{GuestSpec, Role};
use crate::Error;

/// A QEMU version (major, minor, micro).
pub type Version = (u32, u32, u32);

/// The version in the first line of `qemu --version`
/// ("QEMU emulator version 11.1.0 (Debian ...)").
pub fn parse_version(first_line: &str) -> Option<Version> {
    let rest = &first_line[first_line.find("version ")? + 8..];
    let mut nums = [None; 3];
    let mut s = rest;
    for (i, n) in nums.iter_mut().enumerate() {
        if i > 0 {
            match s.strip_prefix('.') {
                Some(t) if t.starts_with(|c: char| c.is_ascii_digit()) => s = t,
                _ => break,
            }
        }
        let len = s.bytes().take_while(u8::is_ascii_digit).count();
        *n = s[..len].parse::<u32>().ok();
        s = &s[len..];
    }
    Some((nums[0]?, nums[1]?, nums[2].unwrap_or(0)))
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Its exit code (the negated signal number when a signal ended it).
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `cmd`, returning its stdout and stderr, or `None` when it cannot be
/// started or outlives `timeout` (then it is killed).
pub fn capture(cmd: &mut Command, timeout: Duration) -> Option<(String, String)> {
    run_with_timeout(cmd, timeout).map(|o| (o.stdout, o.stderr))
}

/// Starts `cmd` with stdin closed and stdout and stderr piped to us.
pub fn spawn_piped(cmd: &mut Command) -> Option<std::process::Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()
}

/// Runs `cmd` (stdin closed), returning what it printed and its exit code,
/// or `None` when it cannot be started or outlives `timeout` (then it is
/// killed).
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Option<Output> {
    use std::os::unix::process::ExitStatusExt;
    let mut child = spawn_piped(cmd)?;
    let read = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = read(child.stdout.take().map(|r| Box::new(r) as _));
    let err = read(child.stderr.take().map(|r| Box::new(r) as _));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().ok()? {
            break st;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Some(Output {
        code: status
            .code()
            .unwrap_or_else(|| -status.signal().unwrap_or(0)),
        stdout: out.join().ok()?,
        stderr: err.join().ok()?,
    })
}

/// Runs `cmd` (within `timeout`): its stdout when it exits 0, else an
/// error naming it with its stderr.
pub fn checked(cmd: &mut Command, timeout: Duration) -> anyhow::Result<String> {
    let name = format!(
        "{:?} {:?}",
        cmd.get_program(),
        cmd.get_args().collect::<Vec<_>>()
    );
    match run_with_timeout(cmd, timeout) {
        Some(o) if o.code == 0 => Ok(o.stdout),
        Some(o) => Err(anyhow::anyhow!(
            "{name}: exit {}: {}",
            o.code,
            o.stderr.trim()
        )),
        None => Err(anyhow::anyhow!(
            "{name}: did not run or outlived {} s",
            timeout.as_secs()
        )),
    }
}

/// The version of `qemu` and the first line of its `--version`.
pub fn qemu_version(qemu: &str) -> Result<(Version, String), Error> {
    let (out, _) = capture(Command::new(qemu).arg("--version"), Duration::from_secs(30))
        .ok_or_else(|| Error::Usage(format!("cannot run {qemu} --version")))?;
    let first = out.lines().next().unwrap_or("");
    let v = parse_version(first).ok_or_else(|| {
        Error::Usage(format!(
            "cannot parse QEMU version from {}",
            crate::spec::repr(first)
        ))
    })?;
    Ok((v, first.trim().to_string()))
}

/// Whether `qemu -device help` lists device `dev`.
pub fn has_device(qemu: &str, dev: &str) -> bool {
    capture(
        Command::new(qemu).args(["-machine", "none", "-device", "help"]),
        Duration::from_secs(30),
    )
    .is_some_and(|(o, e)| {
        o.contains(&format!("name \"{dev}\"")) || e.contains(&format!("name \"{dev}\""))
    })
}

/// Whether a vhost-user virtio-net-pci gets `vectors=0` (INTx) instead of
/// MSI-X. QEMU 7.2 (Debian bookworm's) segfaults in vhost_net_start ->
/// msix_set_vector_notifiers -> virtio_pci_vector_unmask when the guest
/// starts a vhost-user virtio-net-pci with MSI-X under TCG (no KVM irqfds);
/// QEMU 11.1 is fine. `auto` turns MSI-X off only there.
pub fn msix_off(msix: &str, accel: &str, qver: Version) -> bool {
    match msix {
        "auto" => accel != "kvm" && qver < (8, 0, 0),
        m => m == "off",
    }
}

/// What a run's guests share: the options, the boot files, QEMU's version.
#[derive(Debug, Clone)]
pub struct Machine<'a> {
    /// The run's options (`qemu` resolved, `guest_bin` absolute).
    pub opts: &'a BootOptions,
    /// Absolute bzImage path.
    pub kernel: String,
    /// Absolute root disk path.
    pub rootfs: String,
    /// Absolute initrd path, if any.
    pub initrd: Option<String>,
    /// QEMU's version.
    pub qver: Version,
}

/// Where one guest's files are, for its command line.
#[derive(Debug, Clone, Copy)]
pub struct GuestDirs<'a> {
    /// Host directory exported as 9p tag `job`.
    pub job_dir: &'a str,
    /// HMP monitor socket (`--monitor`), else `-monitor none`.
    pub monitor: Option<&'a str>,
    /// Host directory exported read-only as 9p tag `vrbin` (`--guest-bin`).
    pub guest_bin: Option<&'a str>,
}

/// The QEMU command line of guest `g` under `accel` (`kvm` or `tcg`).
pub fn build_qemu_cmd(
    g: &GuestSpec,
    dirs: GuestDirs,
    accel: &str,
    m: &Machine,
) -> Result<Vec<String>, Error> {
    let o = m.opts;
    let mem = g.opts.mem.unwrap_or(o.mem);
    let smp = g.opts.smp.unwrap_or(o.smp);
    let form = g.opts.form.as_deref().unwrap_or(&o.form);
    let net = g.opts.net.as_deref().unwrap_or(&o.net);
    let queues = g.opts.queues.unwrap_or(o.queues);
    let mut cmd: Vec<String> = vec![o.qemu.clone()];
    let mut add = |args: &[&str]| cmd.extend(args.iter().map(|s| s.to_string()));
    if accel == "kvm" {
        add(&["-accel", "kvm", "-cpu", "host"]);
    } else {
        add(&[
            "-accel",
            &format!("tcg,tb-size={}", o.tb_size),
            "-cpu",
            "max",
        ]);
    }
    // vhost-user needs guest RAM that the backend can map: memfd, share=on.
    // --monitor: an HMP socket per guest, so a host tool can ask a guest
    // that stopped answering where its CPU is (info registers).
    let monitor = dirs
        .monitor
        .map_or("none".into(), |p| format!("unix:{p},server=on,wait=off"));
    add(&[
        "-machine",
        &format!("{},memory-backend=mem", o.machine),
        "-object",
        &format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
        "-m",
        &format!("{mem}M"),
        "-smp",
        &smp.to_string(),
        "-display",
        "none",
        "-vga",
        "none",
        "-no-user-config",
        "-nodefaults",
        "-no-reboot",
        "-monitor",
        &monitor,
        "-chardev",
        "stdio,id=con0,signal=off",
        "-serial",
        "chardev:con0",
        "-kernel",
        &m.kernel,
    ]);
    if let Some(initrd) = &m.initrd {
        add(&["-initrd", initrd]);
    }
    let mut app: Vec<String> = [
        "root=/dev/vda",
        "ro",
        "init=/sbin/vr-init",
        "console=ttyS0",
        "panic=-1",
    ]
    .map(String::from)
    .into();
    app.push(format!("vr.name={}", g.name));
    for nic in &g.nics {
        if let Some(ip) = &nic.ip {
            let n = if nic.idx == 0 {
                String::new()
            } else {
                nic.idx.to_string()
            };
            app.push(format!("vr.ip{n}={ip}"));
        }
    }
    app.extend(
        [&o.append, g.opts.append.as_deref().unwrap_or("")]
            .iter()
            .filter(|a| !a.is_empty())
            .map(|a| a.to_string()),
    );
    add(&["-append", &app.join(" ")]);
    // root disk: snapshot=on lets many guests share one image (writes go to
    // a throwaway overlay; the base file is only read)
    add(&[
        "-drive",
        &format!("file={},if=virtio,format=raw,snapshot=on", m.rootfs),
    ]);
    add(&[
        "-fsdev",
        &format!("local,id=fsjob,path={},security_model=none", dirs.job_dir),
    ]);
    add(&["-device", "virtio-9p-pci,fsdev=fsjob,mount_tag=job"]);
    if let Some(bin) = dirs.guest_bin {
        add(&[
            "-fsdev",
            &format!("local,id=fsbin,path={bin},security_model=none,readonly=on"),
        ]);
        add(&["-device", "virtio-9p-pci,fsdev=fsbin,mount_tag=vrbin"]);
    }
    for nic in &g.nics {
        let i = nic.idx;
        let mac = nic.mac.as_deref().unwrap_or_default();
        if net == "none" {
            continue;
        }
        if net == "stream" || nic.stream.is_some() {
            let Some(s) = &nic.stream else {
                return Err(Error::Usage(format!(
                    "guest {}: nic {i} has no stream link",
                    g.name
                )));
            };
            let server = if s.role == Role::Server { "on" } else { "off" };
            add(&[
                "-netdev",
                &format!(
                    "stream,id=n{i},server={server},addr.type=unix,addr.path={}",
                    s.path
                ),
            ]);
            add(&[
                "-device",
                &format!("virtio-net-pci,netdev=n{i},mac={mac},romfile="),
            ]);
        } else if net == "vhost-user" {
            let Some(sock) = &nic.sock else {
                let n = if i == 0 { String::new() } else { i.to_string() };
                return Err(Error::Usage(format!(
                    "guest {}: --net vhost-user needs sock{n}=PATH",
                    g.name
                )));
            };
            add(&["-chardev", &format!("socket,id=c{i},path={sock}")]);
            if form == "pci" {
                add(&[
                    "-netdev",
                    &format!("vhost-user,id=n{i},chardev=c{i},queues={queues}"),
                ]);
                let mut dev = format!("virtio-net-pci,netdev=n{i},mac={mac},romfile=");
                let intx = msix_off(&o.msix, accel, m.qver);
                if intx {
                    dev += ",vectors=0";
                }
                if queues > 1 {
                    dev += ",mq=on";
                    if !intx {
                        dev += &format!(",vectors={}", 2 * queues + 2);
                    }
                }
                add(&["-device", &dev]);
            } else if form == "testdev" {
                if m.qver < (10, 2, 0) {
                    let (a, b, c) = m.qver;
                    return Err(Error::Setup(format!(
                        "--form testdev needs QEMU >= 10.2 (this is {a}.{b}.{c})"
                    )));
                }
                let nvq = if o.testdev_num_vqs != 0 {
                    o.testdev_num_vqs
                } else {
                    2 * queues + 1
                };
                add(&[
                    "-device",
                    &format!(
                        "vhost-user-test-device-pci,chardev=c{i},virtio-id=1,num_vqs={nvq},vq_size={},config_size={}",
                        o.vq_size, o.config_size
                    ),
                ]);
            } else {
                return Err(Error::Usage(format!("unknown --form {form}")));
            }
        } else {
            return Err(Error::Usage(format!("unknown --net {net}")));
        }
    }
    for path in &g.opts.vfio {
        let path = serde_json::to_string(path).unwrap_or_default();
        add(&[
            "-device",
            &format!(
                r#"{{"driver": "vfio-user-pci", "socket": {{"type": "unix", "path": {path}}}}}"#
            ),
        ]);
    }
    cmd.extend(o.qemu_arg.iter().cloned());
    Ok(cmd)
}

/// `s` quoted for a POSIX shell when it needs it (as Python's `shlex.quote`).
pub fn shell_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b))
    {
        return s.into();
    }
    format!("'{}'", s.replace('\'', r#"'"'"'"#))
}

/// A shell-quoted command line, one option (with its value) per line,
/// joined by ` \` continuations: the `--dry-run` output and `NAME.qemu-cmd.sh`.
pub fn fmt_cmd(cmd: &[String]) -> String {
    let mut out = vec![shell_quote(&cmd[0])];
    let mut i = 1;
    while i < cmd.len() {
        if cmd[i].starts_with('-') && i + 1 < cmd.len() && !cmd[i + 1].starts_with('-') {
            out.push(format!(
                "{} {}",
                shell_quote(&cmd[i]),
                shell_quote(&cmd[i + 1])
            ));
            i += 2;
        } else {
            out.push(shell_quote(&cmd[i]));
            i += 1;
        }
    }
    out.join(" \\\n  ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_guest_spec;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        boot: BootOptions,
    }

    fn opts(args: &[&str]) -> BootOptions {
        let mut o = Cli::parse_from(["x"].iter().chain(args)).boot;
        o.qemu = "/q/qemu".into();
        o
    }

    fn cmd(args: &[&str], guest: &str, accel: &str, qver: Version) -> Result<Vec<String>, Error> {
        let o = opts(args);
        let m = Machine {
            opts: &o,
            kernel: "/i/bzImage".into(),
            rootfs: "/i/rootfs.ext4".into(),
            initrd: None,
            qver,
        };
        let g = parse_guest_spec(guest, 0)?;
        let dirs = GuestDirs {
            job_dir: "/l/a.job",
            monitor: None,
            guest_bin: o.guest_bin.as_deref(),
        };
        build_qemu_cmd(&g, dirs, accel, &m)
    }

    fn joined(c: &[String]) -> String {
        c.join(" ")
    }

    #[test]
    fn the_whole_vhost_user_line() {
        let c = cmd(&[], "a,ip=10.77.0.1/24,sock=/t/a.sock", "tcg", (11, 1, 0)).unwrap();
        let want = "/q/qemu -accel tcg,tb-size=256 -cpu max -machine pc,memory-backend=mem \
            -object memory-backend-memfd,id=mem,size=512M,share=on -m 512M -smp 1 -display none -vga none \
            -no-user-config -nodefaults -no-reboot -monitor none -chardev stdio,id=con0,signal=off \
            -serial chardev:con0 -kernel /i/bzImage \
            -append root=/dev/vda ro init=/sbin/vr-init console=ttyS0 panic=-1 vr.name=a vr.ip=10.77.0.1/24 \
            -drive file=/i/rootfs.ext4,if=virtio,format=raw,snapshot=on \
            -fsdev local,id=fsjob,path=/l/a.job,security_model=none -device virtio-9p-pci,fsdev=fsjob,mount_tag=job \
            -chardev socket,id=c0,path=/t/a.sock -netdev vhost-user,id=n0,chardev=c0,queues=1 \
            -device virtio-net-pci,netdev=n0,mac=52:54:00:77:01:00,romfile=";
        assert_eq!(joined(&c), want);
        // the append string is one argument
        assert!(c.contains(&"root=/dev/vda ro init=/sbin/vr-init console=ttyS0 panic=-1 vr.name=a vr.ip=10.77.0.1/24".into()));
    }

    #[test]
    fn options_reach_the_line() {
        let c = joined(
            &cmd(
                &[
                    "--mem", "1024", "--smp", "2", "--machine", "q35", "--tb-size", "64", "--queues", "2",
                    "--append", "loglevel=8", "--qemu-arg=-s", "--qemu-arg", "-S", "--guest-bin", "/",
                ],
                "a,ip=1.1.1.1/24,ip2=2.2.2.2/24,sock=/a,sock2=/b,smp=4,append=gve.debug=1,vfio=/r.sock",
                "kvm",
                (11, 1, 0),
            )
            .unwrap(),
        );
        for want in [
            "/q/qemu -accel kvm -cpu host -machine q35,memory-backend=mem",
            "size=1024M,share=on -m 1024M -smp 4 ",
            "vr.name=a vr.ip=1.1.1.1/24 vr.ip2=2.2.2.2/24 loglevel=8 gve.debug=1 -drive",
            "-fsdev local,id=fsbin,path=/,security_model=none,readonly=on -device virtio-9p-pci,fsdev=fsbin,mount_tag=vrbin",
            "-netdev vhost-user,id=n2,chardev=c2,queues=2 -device virtio-net-pci,netdev=n2,mac=52:54:00:77:01:01,romfile=,mq=on,vectors=6",
            r#"-device {"driver": "vfio-user-pci", "socket": {"type": "unix", "path": "/r.sock"}} -s -S"#,
        ] {
            assert!(c.contains(want), "{want}\n in {c}");
        }
    }

    #[test]
    fn msix_and_forms() {
        // QEMU 7.2 under TCG: INTx; --msix on forces MSI-X; KVM keeps it
        let c = joined(&cmd(&["--queues", "2"], "a,sock=/a", "tcg", (7, 2, 22)).unwrap());
        assert!(c.ends_with("romfile=,vectors=0,mq=on"), "{c}");
        let c = joined(&cmd(&["--msix", "on"], "a,sock=/a", "tcg", (7, 2, 22)).unwrap());
        assert!(c.ends_with("romfile="), "{c}");
        let c = joined(&cmd(&["--msix", "off"], "a,sock=/a", "kvm", (11, 1, 0)).unwrap());
        assert!(c.ends_with("romfile=,vectors=0"), "{c}");
        let c = joined(
            &cmd(
                &["--form", "testdev", "--queues", "4"],
                "a,sock=/a",
                "tcg",
                (11, 1, 0),
            )
            .unwrap(),
        );
        assert!(
            c.ends_with("-device vhost-user-test-device-pci,chardev=c0,virtio-id=1,num_vqs=9,vq_size=256,config_size=24"),
            "{c}"
        );
        let e = cmd(&["--form", "testdev"], "a,sock=/a", "tcg", (10, 1, 0)).unwrap_err();
        assert!(
            matches!(e, Error::Setup(ref m) if m.contains("needs QEMU >= 10.2 (this is 10.1.0)")),
            "{e}"
        );
        let e = cmd(&[], "a", "tcg", (11, 1, 0)).unwrap_err().to_string();
        assert_eq!(e, "guest a: --net vhost-user needs sock=PATH");
        let e = cmd(&["--net", "stream"], "a", "tcg", (11, 1, 0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "guest a: nic 0 has no stream link");
        let e = cmd(&[], "a,sock=/a,form=virtio", "tcg", (11, 1, 0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "unknown --form virtio");
        let c = joined(
            &cmd(
                &["--net", "none", "--accel", "tcg"],
                "a,ip=1.2.3.4/8",
                "tcg",
                (11, 1, 0),
            )
            .unwrap(),
        );
        assert!(
            !c.contains("virtio-net") && c.contains("vr.ip=1.2.3.4/8"),
            "{c}"
        );
        let c = joined(&cmd(&[], "a,stream=server:/s.sock", "tcg", (11, 1, 0)).unwrap());
        assert!(c.ends_with(
            "-netdev stream,id=n0,server=on,addr.type=unix,addr.path=/s.sock -device virtio-net-pci,netdev=n0,mac=52:54:00:77:01:00,romfile="
        ));
    }

    #[test]
    fn quoting_and_layout() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a=b,c:/d.e-f@%+"), "a=b,c:/d.e-f@%+");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r#"'it'"'"'s'"#);
        let c: Vec<String> = [
            "/q",
            "-nodefaults",
            "-m",
            "512M",
            "-append",
            "a b",
            "-s",
            "x",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            fmt_cmd(&c),
            "/q \\\n  -nodefaults \\\n  -m 512M \\\n  -append 'a b' \\\n  -s x"
        );
    }

    #[test]
    fn versions() {
        assert_eq!(
            parse_version("QEMU emulator version 11.1.0 (Debian 1:11.1+ds-1)"),
            Some((11, 1, 0))
        );
        assert_eq!(
            parse_version("QEMU emulator version 7.2.22"),
            Some((7, 2, 22))
        );
        assert_eq!(
            parse_version("QEMU emulator version 10.2"),
            Some((10, 2, 0))
        );
        assert_eq!(parse_version("version 9"), None);
        assert_eq!(parse_version("no"), None);
        assert!(msix_off("auto", "tcg", (7, 2, 0)) && !msix_off("auto", "kvm", (7, 2, 0)));
        assert!(!msix_off("auto", "tcg", (8, 0, 0)));
    }
}

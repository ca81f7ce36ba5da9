//! `--guest NAME,key=value,...`: one guest's NICs, job and overrides.

use crate::paths::abspath;
use crate::Error;

/// Which end of a QEMU `-netdev stream` link a NIC is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Creates the unix socket (`server=on`).
    Server,
    /// Connects to it (`server=off`).
    Client,
}

/// One end of a `-netdev stream` link over a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Server or client.
    pub role: Role,
    /// Absolute socket path.
    pub path: String,
}

/// NIC `idx` of a guest (`ipN=`, `sockN=`, `macN=`, `streamN=`; no N for 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicSpec {
    /// The N of the keys; the guest sees the NIC as ethN when the indices are dense.
    pub idx: u32,
    /// vhost-user socket (absolute).
    pub sock: Option<String>,
    /// MAC address; the parser fills in `52:54:00:77:GG:NN` when absent.
    pub mac: Option<String>,
    /// `ADDR/PREFIX` for the guest's vr-init (`vr.ip=`, `vr.ipN=`).
    pub ip: Option<String>,
    /// A `-netdev stream` link instead of vhost-user.
    pub stream: Option<Stream>,
}

/// Per-guest overrides of the run's options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestOpts {
    /// `mem=` MiB.
    pub mem: Option<i64>,
    /// `smp=` vCPUs.
    pub smp: Option<i64>,
    /// `queues=` queue pairs per vhost-user NIC.
    pub queues: Option<i64>,
    /// `timeout=` seconds from QEMU start to the result.
    pub timeout: Option<i64>,
    /// `form=` pci or testdev.
    pub form: Option<String>,
    /// `net=` vhost-user, stream or none.
    pub net: Option<String>,
    /// `append=` kernel command-line additions.
    pub append: Option<String>,
    /// `vfio=SOCK` (repeatable): vfio-user PCI devices (absolute socket paths).
    pub vfio: Vec<String>,
}

/// One `--guest` option, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestSpec {
    /// Guest name (`[A-Za-z0-9_.-]+`): `vr.name=`, file names in the log directory.
    pub name: String,
    /// `cmd=FILE`: the job, copied to the guest's `/job/run.sh`.
    pub cmd_file: Option<String>,
    /// NICs in index order; at least one.
    pub nics: Vec<NicSpec>,
    /// Overrides of the run's options.
    pub opts: GuestOpts,
}

/// Python's `repr` of a string, as the messages always quoted specs.
pub(crate) fn repr(s: &str) -> String {
    guest_results::pyjson::py_repr_str(s)
}

/// Parses `--guest` option `spec`, the `idx`-th (0-based; it picks the
/// default MACs `52:54:00:77:{idx+1}:{nic}`).
pub fn parse_guest_spec(spec: &str, idx: usize) -> Result<GuestSpec, Error> {
    let die = |m: String| Err(Error::Usage(m));
    let mut parts = spec.split(',');
    let name = parts.next().unwrap_or("").trim();
    let valid = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    if !valid(name) {
        return die(format!(
            "--guest {}: first field must be the guest name ([A-Za-z0-9_.-]+)",
            repr(spec)
        ));
    }
    let mut g = GuestSpec {
        name: name.into(),
        cmd_file: None,
        nics: vec![],
        opts: GuestOpts::default(),
    };
    let mut nics = std::collections::BTreeMap::<u32, NicSpec>::new();
    for kv in parts.filter(|kv| !kv.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else {
            return die(format!(
                "--guest {}: expected key=value, got {}",
                repr(spec),
                repr(kv)
            ));
        };
        let k = k.trim();
        let nic_key = ["ip", "sock", "mac", "stream"]
            .into_iter()
            .find_map(|base| {
                let n = k.strip_prefix(base)?;
                n.bytes().all(|b| b.is_ascii_digit()).then_some((base, n))
            });
        if let Some((base, n)) = nic_key {
            let Ok(i) = (if n.is_empty() {
                Ok(0)
            } else {
                n.parse::<u32>()
            }) else {
                return die(format!("--guest {name}: unknown key {}", repr(k)));
            };
            let nic = nics.entry(i).or_insert_with(|| NicSpec {
                idx: i,
                ..Default::default()
            });
            match base {
                "stream" => {
                    let (role, path) = v.split_once(':').unwrap_or((v, ""));
                    let role = match role {
                        "server" => Role::Server,
                        "client" => Role::Client,
                        _ => {
                            return die(format!(
                                "--guest {name}: stream{n}= wants server:PATH or client:PATH"
                            ))
                        }
                    };
                    if path.is_empty() {
                        return die(format!(
                            "--guest {name}: stream{n}= wants server:PATH or client:PATH"
                        ));
                    }
                    nic.stream = Some(Stream {
                        role,
                        path: abspath(path),
                    });
                }
                "sock" => nic.sock = Some(abspath(v)),
                "mac" => nic.mac = Some(v.into()),
                _ => nic.ip = Some(v.into()),
            }
            continue;
        }
        let int = || {
            v.trim()
                .parse::<i64>()
                .map_err(|_| Error::Usage(format!("--guest {name}: {k}= wants an integer")))
        };
        match k {
            "cmd" => g.cmd_file = Some(v.into()),
            "mem" => g.opts.mem = Some(int()?),
            "smp" => g.opts.smp = Some(int()?),
            "queues" => g.opts.queues = Some(int()?),
            "timeout" => g.opts.timeout = Some(int()?),
            "form" => g.opts.form = Some(v.into()),
            "net" => g.opts.net = Some(v.into()),
            "append" => g.opts.append = Some(v.into()),
            "vfio" => g.opts.vfio.push(abspath(v)),
            _ => return die(format!("--guest {name}: unknown key {}", repr(k))),
        }
    }
    g.nics = nics.into_values().collect();
    if g.nics.is_empty() {
        g.nics.push(NicSpec::default());
    }
    for (i, nic) in g.nics.iter_mut().enumerate() {
        nic.mac
            .get_or_insert_with(|| format!("52:54:00:77:{:02x}:{:02x}", (idx + 1) & 0xff, i));
    }
    Ok(g)
}

/// `--net stream` without explicit `stream=` keys: pairs the guests that
/// need a link (0-1, 2-3, ...) on their NIC 0, the first of each pair the
/// server, over `LOGDIR/stream-A-B.sock`.
pub fn default_stream_links(
    guests: &mut [GuestSpec],
    default_net: &str,
    logdir: &str,
) -> Result<(), Error> {
    let need: Vec<usize> = (0..guests.len())
        .filter(|&i| {
            guests[i].opts.net.as_deref().unwrap_or(default_net) == "stream"
                && guests[i].nics[0].stream.is_none()
        })
        .collect();
    if need.len() % 2 == 1 {
        return Err(Error::Usage(
            "--net stream pairs guests (server, client); give an even number of guests or explicit \
             stream=server:PATH / stream=client:PATH keys"
                .into(),
        ));
    }
    for pair in need.chunks(2) {
        let path = format!(
            "{logdir}/stream-{}-{}.sock",
            guests[pair[0]].name, guests[pair[1]].name
        );
        guests[pair[0]].nics[0].stream = Some(Stream {
            role: Role::Server,
            path: path.clone(),
        });
        guests[pair[1]].nics[0].stream = Some(Stream {
            role: Role::Client,
            path,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_spec() {
        let g = parse_guest_spec(
            "a,ip=10.77.0.1/24,sock=/t/a.sock,ip1=10.78.0.1/24,sock1=/t/a1.sock,mac1=52:54:00:00:00:09,\
             cmd=a.sh,mem=1024,smp=2,queues=4,timeout=60,form=testdev,net=vhost-user,append=x=1,vfio=/t/r.sock,vfio=/t/g.sock",
            2,
        )
        .unwrap();
        assert_eq!(g.name, "a");
        assert_eq!(g.cmd_file.as_deref(), Some("a.sh"));
        assert_eq!(g.nics.len(), 2);
        assert_eq!(
            g.nics[0],
            NicSpec {
                idx: 0,
                sock: Some("/t/a.sock".into()),
                mac: Some("52:54:00:77:03:00".into()),
                ip: Some("10.77.0.1/24".into()),
                stream: None
            }
        );
        assert_eq!(g.nics[1].mac.as_deref(), Some("52:54:00:00:00:09"));
        assert_eq!(
            g.opts,
            GuestOpts {
                mem: Some(1024),
                smp: Some(2),
                queues: Some(4),
                timeout: Some(60),
                form: Some("testdev".into()),
                net: Some("vhost-user".into()),
                append: Some("x=1".into()),
                vfio: vec!["/t/r.sock".into(), "/t/g.sock".into()],
            }
        );
    }

    #[test]
    fn defaults_streams_and_paths() {
        let g = parse_guest_spec("b", 0).unwrap();
        assert_eq!(
            g.nics,
            vec![NicSpec {
                mac: Some("52:54:00:77:01:00".into()),
                ..Default::default()
            }]
        );
        // NIC indices need not be dense; the default MAC numbers them in order
        let g = parse_guest_spec("c,ip3=1.2.3.4/24,stream3=client:/x/../s.sock", 0).unwrap();
        assert_eq!(g.nics[0].idx, 3);
        assert_eq!(g.nics[0].mac.as_deref(), Some("52:54:00:77:01:00"));
        assert_eq!(
            g.nics[0].stream,
            Some(Stream {
                role: Role::Client,
                path: "/s.sock".into()
            })
        );
        let g = parse_guest_spec("d,sock=rel.sock", 255).unwrap();
        assert!(g.nics[0].sock.as_deref().unwrap().starts_with('/'));
        assert_eq!(g.nics[0].mac.as_deref(), Some("52:54:00:77:00:00"));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (spec, why) in [
            ("", "first field must be the guest name"),
            ("a b", "first field must be the guest name"),
            ("ip=1", "first field must be the guest name"),
            ("a,ip", "--guest 'a,ip': expected key=value, got 'ip'"),
            (
                "a,stream=peer:/x",
                "--guest a: stream= wants server:PATH or client:PATH",
            ),
            (
                "a,stream1=server",
                "--guest a: stream1= wants server:PATH or client:PATH",
            ),
            ("a,mem=lots", "--guest a: mem= wants an integer"),
            ("a,colour=red", "--guest a: unknown key 'colour'"),
        ] {
            let e = parse_guest_spec(spec, 0).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
        assert_eq!(repr("it's"), "\"it's\"");
    }

    #[test]
    fn stream_pairs() {
        let mut gs: Vec<_> = ["a", "b", "c,net=vhost-user", "d,stream=server:/s", "e", "f"]
            .iter()
            .enumerate()
            .map(|(i, s)| parse_guest_spec(s, i).unwrap())
            .collect();
        default_stream_links(&mut gs, "stream", "/l").unwrap();
        let s = |i: usize| gs[i].nics[0].stream.clone();
        assert_eq!(
            s(0),
            Some(Stream {
                role: Role::Server,
                path: "/l/stream-a-b.sock".into()
            })
        );
        assert_eq!(
            s(1),
            Some(Stream {
                role: Role::Client,
                path: "/l/stream-a-b.sock".into()
            })
        );
        assert_eq!(s(2), None);
        assert_eq!(
            s(3),
            Some(Stream {
                role: Role::Server,
                path: "/s".into()
            })
        );
        assert_eq!(
            s(5),
            Some(Stream {
                role: Role::Client,
                path: "/l/stream-e-f.sock".into()
            })
        );
        let mut odd = vec![parse_guest_spec("a", 0).unwrap()];
        assert!(default_stream_links(&mut odd, "stream", "/l")
            .unwrap_err()
            .to_string()
            .contains("pairs guests"));
    }
}

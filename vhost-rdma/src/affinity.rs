//! `--cpu-affinity` / `cpu-affinity`: the CPUs the daemon's threads may run
//! on, as `taskset -c` takes them ("1", "0,2", "2-5,8").
//!
//! Why a daemon option and not only `taskset`: a frame crosses two of the
//! daemon's threads (the sender's TX worker and the receiver's RX worker);
//! when the scheduler puts them on different CPUs every frame, its buffer,
//! queue slot and counters move between caches. On a small host that shares
//! its CPUs with the guests, keeping the switch on one CPU of its own halves
//! its CPU per frame (`ci/README.md`, the testpmd benchmark), just as
//! dpdk-testpmd is given its forwarding core with `-l`. The default is no
//! pinning: the scheduler decides.

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Highest CPU number the kernel's affinity mask takes here (`CPU_SETSIZE`).
pub const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// A set of CPU numbers, parsed from a list such as "0,2-3".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(Vec<usize>);

/// What is wrong with a CPU list or with pinning to it.
#[derive(Debug, Error)]
pub enum AffinityError {
    #[error("{0:?} is not a CPU list such as 1 or 0,2-3")]
    Syntax(String),
    #[error("CPU {cpu} in {list:?} is beyond the highest CPU number, {}", MAX_CPUS - 1)]
    TooHigh { cpu: usize, list: String },
    #[error("none of CPUs {want} may be used by this process (it may use {allowed})")]
    NoneAllowed { want: CpuList, allowed: CpuList },
    #[error("cannot read this process's CPU affinity: {0}")]
    Read(std::io::Error),
    #[error("cannot pin thread {tid} to CPUs {want}: {err}")]
    Pin {
        tid: i32,
        want: CpuList,
        err: std::io::Error,
    },
}

impl CpuList {
    /// The CPU numbers, ascending, without repeats.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// The CPUs this process may run on now.
    pub fn allowed() -> Result<CpuList, AffinityError> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
        // writes at most `size_of::<cpu_set_t>()` bytes into it.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(AffinityError::Read(std::io::Error::last_os_error()));
            }
            set
        };
        // SAFETY: CPU_ISSET reads bit `c` of a valid set, c < CPU_SETSIZE.
        Ok(CpuList(
            (0..MAX_CPUS)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect(),
        ))
    }

    /// Pins every thread of this process (those running now; threads they
    /// start later inherit it) to these CPUs. CPUs of the list the process
    /// may not use are left out, and returned; pinning to none of them is an
    /// error.
    pub fn pin_process(&self) -> Result<Vec<usize>, AffinityError> {
        let allowed = Self::allowed()?;
        let (usable, refused): (Vec<usize>, Vec<usize>) =
            self.0.iter().partition(|c| allowed.0.contains(c));
        if usable.is_empty() {
            return Err(AffinityError::NoneAllowed {
                want: self.clone(),
                allowed,
            });
        }
        // SAFETY: a zeroed cpu_set_t is a valid empty set; every c < CPU_SETSIZE.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &usable {
                libc::CPU_SET(c, &mut set);
            }
            set
        };
        for tid in threads() {
            // SAFETY: `set` is a valid cpu_set_t of the size given.
            let r = unsafe {
                libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            if r != 0 {
                let err = std::io::Error::last_os_error();
                // A thread that ended meanwhile is no longer ours to pin.
                if err.raw_os_error() != Some(libc::ESRCH) {
                    return Err(AffinityError::Pin {
                        tid,
                        want: CpuList(usable),
                        err,
                    });
                }
            }
        }
        Ok(refused)
    }
}

/// This process's threads (Linux: `/proc/self/task`); just the calling
/// thread if that cannot be read.
fn threads() -> Vec<i32> {
    let listed: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        vec![0]
    } else {
        listed
    }
}

impl FromStr for CpuList {
    type Err = AffinityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || AffinityError::Syntax(s.to_string());
        let num = |t: &str| -> Result<usize, AffinityError> {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            let cpu: usize = t.parse().map_err(|_| AffinityError::TooHigh {
                cpu: usize::MAX,
                list: s.to_string(),
            })?;
            if cpu >= MAX_CPUS {
                return Err(AffinityError::TooHigh {
                    cpu,
                    list: s.to_string(),
                });
            }
            Ok(cpu)
        };
        let mut cpus = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(syntax());
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(num(part)?),
            }
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList(cpus))
    }
}

/// Written back in the list form it is parsed from, ranges folded ("0-3,6").
impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// The configuration file spells it as the command line does: a string.
impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_fold_and_refuse() {
        let l: CpuList = "3,0-1,1,5-6".parse().unwrap();
        assert_eq!(l.cpus(), &[0, 1, 3, 5, 6]);
        assert_eq!(l.to_string(), "0-1,3,5-6");
        assert_eq!("7".parse::<CpuList>().unwrap().to_string(), "7");
        for bad in ["", "a", "1,", "-1", "3-1", "1-2-3", "1 2", "0x1"] {
            let e = bad.parse::<CpuList>().unwrap_err();
            assert!(matches!(e, AffinityError::Syntax(_)), "{bad:?} gave {e}");
        }
        let e = "0,99999".parse::<CpuList>().unwrap_err();
        assert!(e.to_string().contains("beyond the highest CPU"), "{e}");
        let e = "99999999999999999999999".parse::<CpuList>().unwrap_err();
        assert!(matches!(e, AffinityError::TooHigh { .. }), "{e}");
    }

    #[test]
    fn pinning_to_no_allowed_cpu_is_refused_and_changes_nothing() {
        let before = CpuList::allowed().unwrap();
        let far = CpuList(vec![MAX_CPUS - 1]);
        if before.cpus().contains(&(MAX_CPUS - 1)) {
            panic!(
                "this machine allows CPU {}: the test needs a CPU it does not",
                MAX_CPUS - 1
            );
        }
        let e = far.pin_process().unwrap_err();
        assert!(matches!(e, AffinityError::NoneAllowed { .. }), "{e}");
        assert!(e.to_string().contains(&before.to_string()), "{e}");
        assert_eq!(CpuList::allowed().unwrap(), before);
    }
}

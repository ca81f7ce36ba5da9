//! Which cells a matrix run runs: the `--quick` tier, named cells, every
//! cell of a kernel; their order; `--shard I/N`; a bring-your-own
//! `--kernel PATH`; the side lane's arguments (`--jobs 2`).

use crate::cells::{cell_order, ERDMA_CELLS, EXTRA_CELLS, KERNELS, LOSSY_CELLS};

/// The CI tier: gve-faults and erdma-faults mostly wait for driver
/// timeouts and run beside the others with `--jobs 2`.
pub const QUICK: [(&str, &str); 19] = [
    ("7.3", "fabric-pci-1q"),
    ("7.3", "fabric-pci-2q"),
    ("7.3", "fabric-testdev-1q"),
    ("7.3", "fabric-qemu7"),
    ("7.3", "rss"),
    ("7.3", "rxe"),
    ("7.3", "smcr"),
    ("7.3", "vhost-rxe"),
    ("7.3", "vhost-siw"),
    ("7.3", "vhost-erdma"),
    ("7.3", "uplinks"),
    ("7.3", "vxlan"),
    ("7.3", "gve"),
    ("7.3", "erdma-rxe"),
    ("7.3", "erdma-smcr"),
    ("7.3", "upstream-rdma"),
    ("7.3", "upstream-nic"),
    ("7.3", "gve-faults"),
    ("7.3", "erdma-faults"),
];

/// Cells whose guests spend most of their wall time idle, waiting for
/// driver timeouts (a command queue's 15 s, a watchdog's 5 s, a QP's
/// retries): with `--jobs 2` they run beside the other cells, which then
/// lose little CPU (two TCG guests idle in HLT). Their verdicts are
/// evidence, not timings.
pub const WAITING_CELLS: [&str; 2] = ["gve-faults", "erdma-faults"];

/// A cell of one kernel series.
pub type KernelCell = (String, String);

/// Sort key of a cell: the order a run runs and reports cells.
pub fn cell_key(kc: &KernelCell) -> (usize, usize) {
    let order: Vec<&str> = cell_order().into_iter().chain(EXTRA_CELLS).collect();
    (
        KERNELS.iter().position(|k| *k == kc.0).unwrap_or(99),
        order.iter().position(|c| *c == kc.1).unwrap_or(99),
    )
}

/// What the selection depends on.
pub struct Selection<'a> {
    /// `--quick`.
    pub quick: bool,
    /// `--kernel`: a series or "all".
    pub kernel: &'a str,
    /// `--cells`: a comma list of CELL or KERNEL/CELL.
    pub cells: &'a str,
    /// Set for a bring-your-own kernel: its series only.
    pub byo_kernel: Option<&'a str>,
    /// `--shard I/N`.
    pub shard: Option<&'a str>,
}

/// The (kernel, cell) list the arguments ask for, in the run's order; an
/// error for an unknown cell, or, with a bring-your-own kernel, for a cell
/// of another series.
pub fn select_cells(s: &Selection, known: &[&str]) -> Result<Vec<KernelCell>, String> {
    let mut sel: Vec<KernelCell> = Vec::new();
    if s.quick {
        sel = QUICK
            .iter()
            .map(|(k, c)| (k.to_string(), c.to_string()))
            .collect();
    } else {
        let kernels: Vec<&str> = if s.kernel == "all" {
            KERNELS.to_vec()
        } else {
            vec![s.kernel]
        };
        let named: Vec<&str> = s.cells.split(',').filter(|c| !c.is_empty()).collect();
        let cells = if named.is_empty() {
            cell_order()
        } else {
            named
        };
        for c in cells {
            if let Some((k, c2)) = c.split_once('/') {
                if !KERNELS.contains(&k) || !known.contains(&c2) {
                    return Err(format!("unknown cell {c}"));
                }
                sel.push((k.into(), c2.into()));
            } else {
                if !known.contains(&c) {
                    return Err(format!(
                        "unknown cell {c} (have {})",
                        cell_order().join(", ")
                    ));
                }
                // the lossy cells run on 7.3 only unless named with a kernel or --kernel is
                // given; erdma's RoCEv2 mode is newer than 6.12: its cells are 7.3 only
                for k in &kernels {
                    let lossy_ok = !LOSSY_CELLS.contains(&c) || *k == "7.3" || s.kernel != "all";
                    let erdma_ok = !ERDMA_CELLS.contains(&c) || *k == "7.3";
                    if lossy_ok && erdma_ok {
                        sel.push((k.to_string(), c.into()));
                    }
                }
            }
        }
    }
    sel.sort_by_cached_key(cell_key);
    sel.dedup();
    if let Some(series) = s.byo_kernel {
        let other: Vec<String> = sel
            .iter()
            .filter(|(k, _)| k != series)
            .map(|(k, c)| format!("{k}/{c}"))
            .collect();
        if !other.is_empty() {
            return Err(format!(
                "--kernel is a {series} kernel; it cannot run {}",
                other.join(", ")
            ));
        }
    }
    if let Some(shard) = s.shard {
        let (i, n) = parse_shard(shard)?;
        sel = shard_cells(&sel, i, n);
    }
    Ok(sel)
}

/// `I/N` (1 <= I <= N).
pub fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--shard {text:?}: expected I/N with 1 <= I <= N, e.g. 1/2");
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(i) || !digits(n) {
        return Err(bad());
    }
    let (i, n): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if !(1 <= i && i <= n) {
        return Err(bad());
    }
    Ok((i, n))
}

/// The cells of shard I of N: those whose index in the run's stable order
/// is I-1 modulo N. Shards 1..N together hold every cell exactly once,
/// whatever machine computes them.
pub fn shard_cells(sel: &[KernelCell], i: usize, n: usize) -> Vec<KernelCell> {
    let mut sorted = sel.to_vec();
    sorted.sort_by_cached_key(cell_key);
    sorted
        .into_iter()
        .enumerate()
        .filter(|(idx, _)| idx % n == i - 1)
        .map(|(_, kc)| kc)
        .collect()
}

/// Options a side lane's matrix process does not inherit, with the number
/// of values each takes: the parent chooses its cells, results, images and
/// QEMU, and builds once for both.
const SIDE_LANE_DROP: [(&str, usize); 12] = [
    ("--quick", 0),
    ("--dry-run", 0),
    ("--no-build", 0),
    ("--cells", 1),
    ("--shard", 1),
    ("--junit", 1),
    ("--results", 1),
    ("--jobs", 1),
    ("--qemu", 1),
    ("--image-7.3", 1),
    ("--image-6.12", 1),
    ("--combine-out", 1),
];

/// The argument list of the side lane's matrix process (`--jobs 2`): the
/// parent's own arguments less [`SIDE_LANE_DROP`] (as `--opt value` or
/// `--opt=value`), then the lane's cells, results dir, QEMU, images and
/// the big SMC stream's size, with no build.
pub fn side_lane_args(
    argv: &[String],
    cells: &[KernelCell],
    results: &str,
    qemu: &str,
    images: &[(String, String)],
    smc_big_bytes: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = 0;
    for tok in argv {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let name = tok.split('=').next().unwrap_or(tok);
        if let Some((_, n)) = SIDE_LANE_DROP.iter().find(|(o, _)| *o == name) {
            skip = if tok.contains('=') { 0 } else { *n };
            continue;
        }
        out.push(tok.clone());
    }
    let cells: Vec<String> = cells.iter().map(|(k, c)| format!("{k}/{c}")).collect();
    out.extend([
        "--cells".into(),
        cells.join(","),
        "--results".into(),
        results.into(),
        "--no-build".into(),
        "--qemu".into(),
        qemu.into(),
        "--smc-big-bytes".into(),
        smc_big_bytes.into(),
    ]);
    let mut images = images.to_vec();
    images.sort();
    for (k, img) in images {
        out.extend([format!("--image-{k}"), img]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<&'static str> {
        cell_order().into_iter().chain(EXTRA_CELLS).collect()
    }

    fn all(kernel: &str, cells: &str) -> Selection<'static> {
        Selection {
            quick: false,
            kernel: Box::leak(kernel.to_string().into_boxed_str()),
            cells: Box::leak(cells.to_string().into_boxed_str()),
            byo_kernel: None,
            shard: None,
        }
    }

    /// Shards 1..N hold every cell of the selection exactly once, in the
    /// run's order, for any N.
    #[test]
    fn shards_cover_every_cell_exactly_once() {
        let sel = select_cells(&all("all", ""), &known()).unwrap();
        assert!(sel.len() > 20);
        for n in 1..=5 {
            let mut got: Vec<KernelCell> = (1..=n).flat_map(|i| shard_cells(&sel, i, n)).collect();
            assert_eq!(got.len(), sel.len(), "N={n}");
            got.sort_by_key(cell_key);
            assert_eq!(got, sel, "N={n}");
        }
        for bad in ["0/2", "3/2", "1", "a/b", "1/2/3", ""] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    /// The lossy and erdma cells stay on 7.3 unless asked for; a named
    /// kernel cell is taken as named; an unknown cell is an error.
    #[test]
    fn selection_follows_the_kernel_rules() {
        let sel = select_cells(&all("all", "rxe,rxe-lossy,erdma"), &known()).unwrap();
        let names: Vec<String> = sel.iter().map(|(k, c)| format!("{k}/{c}")).collect();
        assert_eq!(names, ["7.3/rxe", "7.3/rxe-lossy", "7.3/erdma", "6.12/rxe"]);
        let sel = select_cells(&all("6.12", "rxe-lossy"), &known()).unwrap();
        assert_eq!(sel, [("6.12".to_string(), "rxe-lossy".to_string())]);
        assert!(select_cells(&all("all", "nope"), &known()).is_err());
        assert!(select_cells(&all("all", "5.4/rxe"), &known()).is_err());
        let byo = Selection {
            byo_kernel: Some("7.3"),
            ..all("7.3", "6.12/rxe")
        };
        let err = select_cells(&byo, &known()).unwrap_err();
        assert!(err.contains("6.12/rxe"), "{err}");
    }

    /// The side lane runs exactly the waiting cells, with the parent's
    /// other options, whichever way they were written.
    #[test]
    fn the_side_lane_keeps_the_parents_options_but_its_own_cells() {
        let argv: Vec<String> = [
            "--quick",
            "--jobs",
            "2",
            "--junit=/tmp/j.xml",
            "--siw-reruns",
            "1",
            "--results",
            "/r",
            "--image-7.3",
            "/img",
            "-v",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let cells = [("7.3".to_string(), "gve-faults".to_string())];
        let images = [("7.3".to_string(), "/img".to_string())];
        let got = side_lane_args(&argv, &cells, "/r/side-lane", "/q", &images, "32M");
        assert_eq!(
            got.join(" "),
            "--siw-reruns 1 -v --cells 7.3/gve-faults --results /r/side-lane --no-build \
             --qemu /q --smc-big-bytes 32M --image-7.3 /img"
        );
    }
}

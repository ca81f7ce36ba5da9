//! The options of `guest-runner boot`: those of scripts/run-guests, with
//! the same names and defaults.

/// struct virtio_net_config through supported_hash_types: mac 6, status 2,
/// max_virtqueue_pairs 2, mtu 2, speed 4, duplex 1, rss_max_key_size 1,
/// rss_max_indirection_table_length 2, supported_hash_types 4 = 24 bytes.
pub const DEFAULT_CONFIG_SIZE: i64 = 24;

/// The options of `guest-runner boot` (those of scripts/run-guests).
#[derive(Debug, Clone, clap::Args)]
pub struct BootOptions {
    /// qemu-system-x86_64 binary (default: $QEMU or from PATH)
    #[arg(long, default_value_t = std::env::var("QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into()))]
    pub qemu: String,
    /// image dir with bzImage and rootfs.ext4
    #[arg(long)]
    pub image: Option<String>,
    /// guest kernel bzImage (overrides IMAGE/bzImage): bring your own, with the drivers built in
    /// (docs/guest-tests.md, 'Bring your own kernel')
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<String>,
    /// root disk (overrides IMAGE/rootfs.ext4)
    #[arg(long)]
    pub rootfs: Option<String>,
    /// optional initrd
    #[arg(long)]
    pub initrd: Option<String>,
    /// accelerator; auto probes KVM with a tiny guest once per kernel and QEMU (cached)
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    pub accel: String,
    /// ignore the cached KVM probe verdict
    #[arg(long)]
    pub reprobe: bool,
    /// only decide the accelerator, print it (kvm|tcg) and exit
    #[arg(long)]
    pub probe_only: bool,
    /// guest RAM in MiB
    #[arg(long, default_value_t = 512)]
    pub mem: i64,
    /// vCPUs per guest
    #[arg(long, default_value_t = 1)]
    pub smp: i64,
    /// machine type
    #[arg(long, default_value = "pc")]
    pub machine: String,
    /// TCG translation cache MiB
    #[arg(long, default_value_t = 256)]
    pub tb_size: i64,
    /// seconds from QEMU start to VR-RESULT, per guest
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// host dir exported read-only as 9p tag vrbin (/opt/vr in the guest)
    #[arg(long)]
    pub guest_bin: Option<String>,
    /// the guests' network
    #[arg(long, default_value = "vhost-user", value_parser = ["vhost-user", "stream", "none"])]
    pub net: String,
    /// vhost-user device form: virtio-net-pci + -netdev vhost-user, or vhost-user-test-device-pci (QEMU >= 10.2)
    #[arg(long, default_value = "pci", value_parser = ["pci", "testdev"])]
    pub form: String,
    /// queue pairs per NIC (vhost-user)
    #[arg(long, default_value_t = 1)]
    pub queues: i64,
    /// vhost-user pci form: MSI-X vectors; auto = off (vectors=0, INTx) only for QEMU < 8 under TCG
    /// (QEMU 7.2 segfaults otherwise), else on
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub msix: String,
    /// testdev: virtio_net_config bytes the daemon serves
    #[arg(long, default_value_t = DEFAULT_CONFIG_SIZE)]
    pub config_size: i64,
    /// testdev: num_vqs (0: 2*queues+1, i.e. with a control queue)
    #[arg(long, default_value_t = 0)]
    pub testdev_num_vqs: i64,
    /// testdev: vq_size
    #[arg(long, default_value_t = 256)]
    pub vq_size: i64,
    /// seconds to wait for vhost-user sockets to appear
    #[arg(long, default_value_t = 30.0)]
    pub sock_wait: f64,
    /// kernel command-line additions (after the runner's own), e.g. "gve.debug=1 loglevel=8"
    #[arg(
        long,
        default_value = "",
        value_name = "ARGS",
        allow_hyphen_values = true
    )]
    pub append: String,
    /// give each guest a QEMU human monitor socket LOGDIR/NAME.mon (e.g. for `info registers` on a
    /// guest that stopped answering)
    #[arg(long)]
    pub monitor: bool,
    /// extra QEMU argument (repeat; one argv element each)
    #[arg(long, allow_hyphen_values = true)]
    pub qemu_arg: Vec<String>,
    /// logs + per-guest job dirs (default: a new temporary dir)
    #[arg(long)]
    pub logdir: Option<String>,
    /// keep the other guests running when one fails
    #[arg(long)]
    pub no_fail_fast: bool,
    /// console lines shown for a failed guest
    #[arg(long, default_value_t = 25)]
    pub tail: usize,
    /// print the QEMU command lines only
    #[arg(long)]
    pub dry_run: bool,
    /// log every guest's end with its status
    #[arg(long, short)]
    pub verbose: bool,
    /// NAME,ip=A/P,sock=PATH,mac=MAC,cmd=FILE[,stream=server|client:PATH][,ip1=,sock1=,mac1=,stream1=]
    /// [,mem=,smp=,queues=,form=,net=,timeout=,append=,vfio=SOCK...]
    #[arg(long, value_name = "SPEC")]
    pub guest: Vec<String>,
}

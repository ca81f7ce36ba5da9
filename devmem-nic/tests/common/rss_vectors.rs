//! Microsoft "Verifying the RSS Hash Calculation" vectors
//! (https://learn.microsoft.com/windows-hardware/drivers/network/verifying-the-rss-hash-calculation),
//! as transcribed in FD.io VPP src/vppinfra/test/toeplitz.c and, identically,
//! in DPDK app/test/test_thash.c ("From 82599 Datasheet 7.1.2.8.3 RSS
//! Verification Suite"). Both copies were read and agree value for value.
//! Shared by the hash's unit tests (src/toeplitz.rs) and the whole-frame RSS
//! tests (tests/rss.rs), both through `#[path]`.

/// (source, source port, destination, destination port, IP-only hash, TCP hash)
pub type Vector<A> = (A, u16, A, u16, u32, u32);

pub const V4: [Vector<[u8; 4]>; 5] = [
    (
        [66, 9, 149, 187],
        2794,
        [161, 142, 100, 80],
        1766,
        0x323e8fc2,
        0x51ccc178,
    ),
    (
        [199, 92, 111, 2],
        14230,
        [65, 69, 140, 83],
        4739,
        0xd718262a,
        0xc626b0ea,
    ),
    (
        [24, 19, 198, 95],
        12898,
        [12, 22, 207, 184],
        38024,
        0xd2d0a5de,
        0x5c2b394a,
    ),
    (
        [38, 27, 205, 30],
        48228,
        [209, 142, 163, 6],
        2217,
        0x82989176,
        0xafc7327f,
    ),
    (
        [153, 39, 163, 191],
        44251,
        [202, 188, 127, 2],
        1303,
        0x5d1809c5,
        0x10e828a2,
    ),
];

pub const V6: [Vector<&str>; 3] = [
    (
        "3ffe:2501:200:1fff::7",
        2794,
        "3ffe:2501:200:3::1",
        1766,
        0x2cc18cd5,
        0x40207d3d,
    ),
    (
        "3ffe:501:8::260:97ff:fe40:efab",
        14230,
        "ff02::1",
        4739,
        0x0f0c461c,
        0xdde51bbf,
    ),
    (
        "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
        44251,
        "fe80::200:f8ff:fe21:67cf",
        38024,
        0x4b61e985,
        0x02d1feef,
    ),
];

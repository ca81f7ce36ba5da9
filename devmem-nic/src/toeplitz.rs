//! The Toeplitz hash used by RSS (Microsoft RSS, virtio-net 5.1.6.4.3).

/// The default 40-byte RSS key used by Microsoft's verification suite, the
/// Intel 82599 datasheet and DPDK (`6d5a56da…bbeac01fa`).
pub const DEFAULT_RSS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Computes the Toeplitz hash of `input` under `key`.
///
/// For every input bit, most significant bit of `input[0]` first, the hash
/// XORs in the 32-bit window of the key that starts at that bit position when
/// the bit is 1. Key bits past the end of `key` read as zero, so a key shorter
/// than `input.len() + 4` bytes is accepted (the tail of the input then only
/// mixes with the key bits that exist).
///
/// ```
/// use devmem_nic::toeplitz::{toeplitz_hash, DEFAULT_RSS_KEY};
/// // 66.9.149.187 -> 161.142.100.80 (Microsoft RSS verification suite).
/// let input = [66, 9, 149, 187, 161, 142, 100, 80];
/// assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), 0x323e_8fc2);
/// ```
pub fn toeplitz_hash(key: &[u8], input: &[u8]) -> u32 {
    let key_byte = |i: usize| u64::from(key.get(i).copied().unwrap_or(0));
    // `window` holds key bits [pos, pos + 64); its top 32 bits are the current
    // 32-bit key window. Refilled one byte at a time.
    let mut window: u64 = 0;
    for i in 0..8 {
        window = (window << 8) | key_byte(i);
    }
    let mut result: u32 = 0;
    for (next_key, &byte) in (8..).zip(input) {
        for bit in (0..8).rev() {
            if byte & (1 << bit) != 0 {
                result ^= (window >> 32) as u32;
            }
            window <<= 1;
        }
        // After 8 shifts the low byte is empty: refill it from the key.
        window |= key_byte(next_key);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    // Test vectors: Microsoft "Verifying the RSS Hash Calculation"
    // (https://learn.microsoft.com/windows-hardware/drivers/network/verifying-the-rss-hash-calculation),
    // as transcribed in FD.io VPP src/vppinfra/test/toeplitz.c ("secret key and
    // test cases taken from" that page) and, identically, in DPDK
    // app/test/test_thash.c ("From 82599 Datasheet 7.1.2.8.3 RSS Verification
    // Suite"). Both copies were read and agree value for value.
    // Columns: source addr, source port, destination addr, destination port,
    // expected IPv4/IPv6-only hash, expected hash with TCP ports.
    /// (source, source port, destination, destination port, IP hash, TCP hash)
    type Vector<A> = (A, u16, A, u16, u32, u32);

    const V4: [Vector<[u8; 4]>; 5] = [
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

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    fn v6_vectors() -> [Vector<[u8; 16]>; 3] {
        [
            (
                v6("3ffe:2501:200:1fff::7"),
                2794,
                v6("3ffe:2501:200:3::1"),
                1766,
                0x2cc18cd5,
                0x40207d3d,
            ),
            (
                v6("3ffe:501:8::260:97ff:fe40:efab"),
                14230,
                v6("ff02::1"),
                4739,
                0x0f0c461c,
                0xdde51bbf,
            ),
            (
                v6("3ffe:1900:4545:3:200:f8ff:fe21:67cf"),
                44251,
                v6("fe80::200:f8ff:fe21:67cf"),
                38024,
                0x4b61e985,
                0x02d1feef,
            ),
        ]
    }

    #[test]
    fn microsoft_ipv4_vectors() {
        for (src, sport, dst, dport, h_ip, h_tcp) in V4 {
            let mut input = Vec::new();
            input.extend_from_slice(&src);
            input.extend_from_slice(&dst);
            assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_ip, "{src:?}");
            input.extend_from_slice(&sport.to_be_bytes());
            input.extend_from_slice(&dport.to_be_bytes());
            assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_tcp, "{src:?}");
        }
    }

    #[test]
    fn microsoft_ipv6_vectors() {
        for (src, sport, dst, dport, h_ip, h_tcp) in v6_vectors() {
            let mut input = Vec::new();
            input.extend_from_slice(&src);
            input.extend_from_slice(&dst);
            assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_ip);
            input.extend_from_slice(&sport.to_be_bytes());
            input.extend_from_slice(&dport.to_be_bytes());
            assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_tcp);
        }
    }

    #[test]
    fn empty_input_and_short_key() {
        assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &[]), 0);
        assert_eq!(toeplitz_hash(&[], &[0xff; 12]), 0);
        // A single set MSB selects exactly the first 32 key bits.
        assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &[0x80]), 0x6d5a56da);
        // Key bits beyond the key read as zero.
        assert_eq!(toeplitz_hash(&[0xff], &[0x80]), 0xff00_0000);
    }

    #[test]
    fn linear_in_input() {
        // Toeplitz is linear over GF(2): h(a ^ b) == h(a) ^ h(b).
        let a = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let b = [0xf0u8, 0x0f, 0x55, 0xaa, 0, 1, 2, 3, 4, 5, 6, 7];
        let x: Vec<u8> = a.iter().zip(b.iter()).map(|(p, q)| p ^ q).collect();
        let k = &DEFAULT_RSS_KEY;
        assert_eq!(
            toeplitz_hash(k, &x),
            toeplitz_hash(k, &a) ^ toeplitz_hash(k, &b)
        );
    }
}

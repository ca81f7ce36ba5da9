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

// The vectors live with the integration tests, which check them through whole frames.
#[cfg(test)]
#[path = "../tests/common/rss_vectors.rs"]
mod rss_vectors;

#[cfg(test)]
mod tests {
    use super::*;

    use rss_vectors::{V4, V6};

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    /// The IP-only hash over the addresses, then the TCP hash with the ports.
    fn check(src: &[u8], sport: u16, dst: &[u8], dport: u16, h_ip: u32, h_tcp: u32) {
        let mut input = Vec::new();
        input.extend_from_slice(src);
        input.extend_from_slice(dst);
        assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_ip, "{src:?}");
        input.extend_from_slice(&sport.to_be_bytes());
        input.extend_from_slice(&dport.to_be_bytes());
        assert_eq!(toeplitz_hash(&DEFAULT_RSS_KEY, &input), h_tcp, "{src:?}");
    }

    #[test]
    fn microsoft_ipv4_vectors() {
        for (src, sport, dst, dport, h_ip, h_tcp) in V4 {
            check(&src, sport, &dst, dport, h_ip, h_tcp);
        }
    }

    #[test]
    fn microsoft_ipv6_vectors() {
        for (src, sport, dst, dport, h_ip, h_tcp) in V6 {
            check(&v6(src), sport, &v6(dst), dport, h_ip, h_tcp);
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

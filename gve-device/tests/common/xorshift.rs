//! A small xorshift generator for the hostile tests: deterministic, no
//! dependency. gve-device's tests reach it through `common`, erdma-device's
//! through `#[path]`.

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

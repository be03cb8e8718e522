//! A bit-exact CPU model of the CUDA kernels in `kernels/parity.cu`.
//!
//! Same buffer layout (shards `stride` bytes apart, 16-byte words), same per-column order
//! of operations, same split-nibble tables from [`Plan::image`], same `__byte_perm`
//! selectors. It is not a fast path (the CPU fallback is `sbod_codec`): it exists so that
//! the kernels' arithmetic is tested against the CPU codec on every machine, GPU or not.

use crate::plan::{KernelKind, Plan, ROWS_PER_GROUP, TABLE_WORDS};

/// CUDA's `__byte_perm(x, y, s)`: byte i of the result is byte `s[4i+2:4i]` of the
/// 8-byte value `y:x` (x holds bytes 0-3).
pub fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let v = ((y as u64) << 32) | x as u64;
    let mut r = 0u32;
    for i in 0..4 {
        let sel = (s >> (4 * i)) & 7;
        r |= (((v >> (8 * sel)) & 0xff) as u32) << (8 * i);
    }
    r
}

/// The kernels' `transpose4`.
pub fn transpose4(t0: u32, t1: u32, t2: u32, t3: u32) -> [u32; 4] {
    let a = byte_perm(t0, t1, 0x5140);
    let b = byte_perm(t2, t3, 0x5140);
    let c = byte_perm(t0, t1, 0x7362);
    let d = byte_perm(t2, t3, 0x7362);
    [
        byte_perm(a, b, 0x5410),
        byte_perm(a, b, 0x7632),
        byte_perm(c, d, 0x5410),
        byte_perm(c, d, 0x7632),
    ]
}

/// The kernels' `gf_acc`: t[b] ^= the 4 rows' products of byte b of w. Offsets are in
/// bytes (nibble * 4), pulled out of a whole word with one byte permute each.
pub fn gf_acc(t: &mut [u32; 4], w: u32, tj: &[u32]) {
    let lo = (w << 2) & 0x3c3c_3c3c;
    let hi = (w >> 2) & 0x3c3c_3c3c;
    for (b, tb) in t.iter_mut().enumerate() {
        let ol = byte_perm(lo, 0, 0x4440 + b as u32);
        let oh = byte_perm(hi, 0, 0x4440 + b as u32);
        *tb ^= tj[ol as usize / 4] ^ tj[(4 * 16 + oh as usize) / 4];
    }
}

/// The kernels' `mul2x4`: each byte times 2 in GF(2^8) (poly 0x11d).
pub fn mul2x4(q: u32) -> u32 {
    let carry = (q >> 7) & 0x0101_0101;
    ((q & 0x7f7f_7f7f) << 1) ^ carry.wrapping_mul(0x1d)
}

fn load4(buf: &[u8], at: usize) -> [u32; 4] {
    let mut w = [0u32; 4];
    for (i, x) in w.iter_mut().enumerate() {
        let b = &buf[at + 4 * i..at + 4 * i + 4];
        *x = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    w
}

fn store4(buf: &mut [u8], at: usize, w: [u32; 4]) {
    for (i, x) in w.iter().enumerate() {
        buf[at + 4 * i..at + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
}

/// Run `plan` over 16-byte words `begin..end` of every shard of `buf` (shard s starts at
/// byte `s * stride`), exactly as the kernel the plan picks would.
pub fn run(plan: &Plan, buf: &mut [u8], stride: usize, begin: usize, end: usize) {
    assert_eq!(stride % 16, 0, "stride must be a multiple of 16 bytes");
    let image = plan.image();
    let nsrc = plan.nsrc();
    let nrow = plan.nrow();
    let groups = plan.groups();
    let slots = &image[groups * nsrc * TABLE_WORDS..];
    let off: Vec<usize> = slots[..nsrc].iter().map(|&s| s as usize * stride).collect();
    let dst: Vec<usize> = slots[nsrc..nsrc + nrow]
        .iter()
        .map(|&s| s as usize * stride)
        .collect();
    match plan.kind {
        KernelKind::Xor => {
            for col in begin..end {
                let mut p = [0u32; 4];
                for &o in &off {
                    let v = load4(buf, o + 16 * col);
                    for i in 0..4 {
                        p[i] ^= v[i];
                    }
                }
                store4(buf, dst[0] + 16 * col, p);
            }
        }
        KernelKind::PQ => {
            for col in begin..end {
                let (mut p, mut q) = ([0u32; 4], [0u32; 4]);
                for &o in off.iter().rev() {
                    let v = load4(buf, o + 16 * col);
                    for i in 0..4 {
                        p[i] ^= v[i];
                        q[i] = mul2x4(q[i]) ^ v[i];
                    }
                }
                store4(buf, dst[0] + 16 * col, p);
                store4(buf, dst[1] + 16 * col, q);
            }
        }
        KernelKind::General => {
            for g in 0..groups {
                let tab = &image[g * nsrc * TABLE_WORDS..(g + 1) * nsrc * TABLE_WORDS];
                let rows = ROWS_PER_GROUP.min(nrow - g * ROWS_PER_GROUP);
                for col in begin..end {
                    let mut t = [[0u32; 4]; 4];
                    for (j, &o) in off.iter().enumerate() {
                        let v = load4(buf, o + 16 * col);
                        let tj = &tab[j * TABLE_WORDS..(j + 1) * TABLE_WORDS];
                        for w in 0..4 {
                            gf_acc(&mut t[w], v[w], tj);
                        }
                    }
                    let o: Vec<[u32; 4]> = t
                        .iter()
                        .map(|x| transpose4(x[0], x[1], x[2], x[3]))
                        .collect();
                    for r in 0..rows {
                        let d = dst[g * ROWS_PER_GROUP + r];
                        store4(buf, d + 16 * col, [o[0][r], o[1][r], o[2][r], o[3][r]]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_perm_matches_cuda_doc_examples() {
        // Identity and swap selectors.
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x3210), 0x4433_2211);
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x0123), 0x1122_3344);
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x5140), 0x6622_5511);
    }

    #[test]
    fn transpose4_transposes() {
        let t = [0x0302_0100u32, 0x1312_1110, 0x2322_2120, 0x3332_3130];
        let o = transpose4(t[0], t[1], t[2], t[3]);
        assert_eq!(o, [0x3020_1000, 0x3121_1101, 0x3222_1202, 0x3323_1303]);
    }

    #[test]
    fn mul2x4_matches_gf_mul() {
        for x in 0..=255u8 {
            let w = u32::from_le_bytes([x, x.wrapping_add(1), x ^ 0x80, 255 - x]);
            let got = mul2x4(w).to_le_bytes();
            for (i, b) in w.to_le_bytes().iter().enumerate() {
                assert_eq!(got[i], sbod_codec::gf::mul(2, *b));
            }
        }
    }
}

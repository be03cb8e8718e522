//! Portable kernels: 256-byte multiplication tables, one output at a time. The reference
//! every SIMD variant is tested against, the fallback, and the tail handler for the few
//! bytes that do not fill a SIMD block.

use crate::gf;

/// dst ^= src
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
    }
}

/// dst ^= c * src
pub fn mul_add(dst: &mut [u8], src: &[u8], c: u8) {
    match c {
        0 => {}
        1 => xor_into(dst, src),
        _ => {
            let t = gf::mul_table(c);
            for (d, s) in dst.iter_mut().zip(src) {
                *d ^= t[*s as usize];
            }
        }
    }
}

/// out = sum coef[i] * src[i]
pub fn dot(coef: &[u8], src: &[&[u8]], out: &mut [u8]) {
    out.fill(0);
    dot_acc(coef, src, out);
}

/// out ^= sum coef[i] * src[i]
pub fn dot_acc(coef: &[u8], src: &[&[u8]], out: &mut [u8]) {
    for (c, s) in coef.iter().zip(src) {
        mul_add(out, s, *c);
    }
}

/// out ^= c * (old ^ new), byte by byte (no temporary buffer).
pub fn mul_add_delta(out: &mut [u8], old: &[u8], new: &[u8], c: u8) {
    let t = gf::mul_table(c);
    for ((o, a), b) in out.iter_mut().zip(old).zip(new) {
        *o ^= t[(*a ^ *b) as usize];
    }
}

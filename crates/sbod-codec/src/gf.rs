//! GF(2^8) arithmetic with the polynomial Linux md and ISA-L use: x^8+x^4+x^3+x^2+1 (0x11d),
//! generator 2.

use std::sync::OnceLock;

/// The field polynomial (with the x^8 term).
pub const POLY: u16 = 0x11d;

struct Tables {
    exp: [u8; 512],
    log: [u8; 256],
    mul: Vec<[u8; 256]>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut exp = [0u8; 512];
        let mut log = [0u8; 256];
        let mut x: u16 = 1;
        for (i, e) in exp.iter_mut().enumerate().take(255) {
            *e = x as u8;
            log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= POLY;
            }
        }
        for i in 255..512 {
            exp[i] = exp[i - 255];
        }
        let mut mul = vec![[0u8; 256]; 256];
        for a in 1..256usize {
            for b in 1..256usize {
                mul[a][b] = exp[log[a] as usize + log[b] as usize];
            }
        }
        Tables { exp, log, mul }
    })
}

/// a * b in GF(2^8).
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    tables().mul[a as usize][b as usize]
}

/// The 256-entry row of products `c * x` for every x.
#[inline]
pub fn mul_table(c: u8) -> &'static [u8; 256] {
    &tables().mul[c as usize]
}

/// 2^e (the generator raised to e), e taken mod 255.
#[inline]
pub fn exp(e: usize) -> u8 {
    tables().exp[e % 255]
}

/// Discrete log base 2; `log(0)` is undefined and panics.
#[inline]
pub fn log(a: u8) -> u8 {
    assert!(a != 0, "log of zero in GF(2^8)");
    tables().log[a as usize]
}

/// Multiplicative inverse; `inv(0)` panics.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "inverse of zero in GF(2^8)");
    let t = tables();
    t.exp[255 - t.log[a as usize] as usize]
}

/// a / b; panics when b is zero.
#[inline]
pub fn div(a: u8, b: u8) -> u8 {
    if a == 0 {
        0
    } else {
        mul(a, inv(b))
    }
}

/// Invert an n x n matrix (row-major) by Gauss-Jordan elimination. `None` if singular.
pub fn invert_matrix(m: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(m.len(), n * n);
    let mut a = m.to_vec();
    let mut out = vec![0u8; n * n];
    for i in 0..n {
        out[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r * n + col] != 0)?;
        if pivot != col {
            for j in 0..n {
                a.swap(pivot * n + j, col * n + j);
                out.swap(pivot * n + j, col * n + j);
            }
        }
        let f = inv(a[col * n + col]);
        for j in 0..n {
            a[col * n + j] = mul(a[col * n + j], f);
            out[col * n + j] = mul(out[col * n + j], f);
        }
        for r in 0..n {
            if r != col {
                let f = a[r * n + col];
                if f != 0 {
                    for j in 0..n {
                        a[r * n + j] ^= mul(f, a[col * n + j]);
                        out[r * n + j] ^= mul(f, out[col * n + j]);
                    }
                }
            }
        }
    }
    Some(out)
}

//! The shared engine behind FP8 E4M3, FP8 E5M2 and FP4 E2M1: one description of a small binary
//! float format, and exact encode / decode / round-in-f32 routines driven by it.
//!
//! Kept in one place so that the three formats cannot drift apart in their rounding: each format
//! module only states its parameters and its special values.

use super::Overflow;
use wide::{f32x8, i32x8};

/// Which special values a format has (this is where the three formats really differ).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Specials {
    /// OCP E4M3 "fn": no infinity; only `S.1111.111` is NaN, so `S.1111.110` = 448 is finite.
    FnNanOnlyAllOnes,
    /// IEEE-like: all-ones exponent is infinity (mantissa 0) or NaN.
    Ieee,
    /// Neither infinity nor NaN (E2M1).
    None,
}

/// A small sign-magnitude binary float format.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    /// Total bits, sign included (8 or 4).
    pub bits: u32,
    /// Mantissa (trailing significand) bits.
    pub man_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// Code of the largest finite magnitude (sign bit clear).
    pub max_code: u8,
    /// Largest finite magnitude.
    pub max: f32,
    /// Unbiased exponent of `max` (the "emax" of the OCP MX tables).
    pub emax: i32,
    /// Special values.
    pub specials: Specials,
}

impl Spec {
    /// The sign bit of a code.
    pub const fn sign_bit(&self) -> u8 {
        1 << (self.bits - 1)
    }

    /// The code an overflowing magnitude becomes (sign clear), under `ovf`.
    pub const fn overflow_code(&self, ovf: Overflow) -> u8 {
        match (ovf, self.specials) {
            (Overflow::Saturate, _) | (Overflow::NanOrInf, Specials::None) => self.max_code,
            // E4M3: NaN is S.1111.111.
            (Overflow::NanOrInf, Specials::FnNanOnlyAllOnes) => self.max_code + 1,
            // IEEE: infinity is the all-ones exponent with a zero mantissa.
            (Overflow::NanOrInf, Specials::Ieee) => {
                (((1u32 << (self.bits - 1 - self.man_bits)) - 1) << self.man_bits) as u8
            }
        }
    }

    /// The value an overflowing magnitude becomes (positive), under `ovf`.
    pub const fn overflow_value(&self, ovf: Overflow) -> f32 {
        match (ovf, self.specials) {
            (Overflow::Saturate, _) | (Overflow::NanOrInf, Specials::None) => self.max,
            (Overflow::NanOrInf, Specials::FnNanOnlyAllOnes) => f32::NAN,
            (Overflow::NanOrInf, Specials::Ieee) => f32::INFINITY,
        }
    }

    /// The code a NaN input becomes, given the input's sign (as this format's sign bit).
    ///
    /// E4M3: `S.1111.111`; E5M2: the quiet NaN `S.11111.10` (what ml_dtypes writes). E2M1 has no
    /// NaN: ml_dtypes writes `0b1000` (−0) for +NaN and `0b0000` for −NaN (it negates its
    /// "quiet NaN" stand-in, −0); the OCP MX spec leaves this implementation-defined, and we follow
    /// ml_dtypes so that golden data compares bit for bit.
    pub const fn nan_code(&self, sign: u8) -> u8 {
        match self.specials {
            Specials::FnNanOnlyAllOnes => sign | (self.max_code + 1),
            Specials::Ieee => sign | (self.overflow_code(Overflow::NanOrInf) + 2),
            Specials::None => self.sign_bit() ^ sign,
        }
    }

    /// Decodes one code (the high bits above `bits` are ignored). NaN codes decode to a quiet NaN
    /// carrying the code's sign.
    pub const fn decode(&self, code: u8) -> f32 {
        let code = (code as u32) & ((1 << self.bits) - 1);
        let sign = (code >> (self.bits - 1)) & 1;
        let mag = code & ((1 << (self.bits - 1)) - 1);
        let sign32 = sign << 31;
        match self.specials {
            Specials::FnNanOnlyAllOnes if mag == self.max_code as u32 + 1 => {
                return f32::from_bits(0x7FC0_0000 | sign32)
            }
            Specials::Ieee => {
                let inf = self.overflow_code(Overflow::NanOrInf) as u32;
                if mag == inf {
                    return f32::from_bits(0x7F80_0000 | sign32);
                }
                if mag > inf {
                    return f32::from_bits(0x7FC0_0000 | sign32);
                }
            }
            _ => {}
        }
        let e = (mag >> self.man_bits) as i32;
        let m = mag & ((1 << self.man_bits) - 1);
        // value = significand · 2^(exp − man_bits); subnormals (e = 0) have no implicit bit and
        // the exponent of the smallest normal binade.
        let (sig, exp) = if e == 0 {
            (m, 1 - self.bias - self.man_bits as i32)
        } else {
            (
                m | (1 << self.man_bits),
                e - self.bias - self.man_bits as i32,
            )
        };
        // Every format here has exp ≥ −126 − 23, and the significand is ≤ 4 bits, so the product
        // below is exact; 2^exp is built from bits (normal f32 for exp ≥ −126).
        let pow2 = f32::from_bits(((exp + 127) as u32) << 23);
        f32::from_bits((sig as f32 * pow2).to_bits() | sign32)
    }

    /// A decode table of all `2^bits` codes.
    pub const fn table<const N: usize>(&self) -> [f32; N] {
        let mut t = [0.0f32; N];
        let mut i = 0;
        while i < N {
            t[i] = self.decode(i as u8);
            i += 1;
        }
        t
    }

    /// Encodes `x`: round to nearest, ties to even, subnormals exact; overflow (including ±inf)
    /// per `ovf`; NaN per [`Spec::nan_code`].
    ///
    /// Integer-only so that it is exact by construction: the magnitude is written as
    /// `mant · 2^(e − 23)`, the target quantum for its binade (the smallest normal binade for
    /// subnormal results) decides how many bits are shifted out, and the rounded significand is
    /// added to the biased exponent so that a rounding carry moves into the exponent by itself.
    pub fn encode(&self, x: f32, ovf: Overflow) -> u8 {
        let bits = x.to_bits();
        let sign = if bits >> 31 != 0 { self.sign_bit() } else { 0 };
        let abs = bits & 0x7FFF_FFFF;
        if abs > 0x7F80_0000 {
            return self.nan_code(sign);
        }
        if abs == 0x7F80_0000 {
            return sign | self.overflow_code(ovf);
        }
        let fexp = (abs >> 23) as i32;
        let (mant, e) = if fexp == 0 {
            (abs & 0x7F_FFFF, -126)
        } else {
            ((abs & 0x7F_FFFF) | 0x80_0000, fexp - 127)
        };
        let emin = 1 - self.bias;
        let te = if e > emin { e } else { emin };
        // Shifts of 25 or more leave nothing (mant < 2^24, so even the round bit is gone).
        let shift = ((23 - self.man_bits as i32) + (te - e)).min(26) as u32;
        let q = rne_shift(mant, shift);
        // (te + bias − 1) << man_bits, plus q with its implicit bit: a subnormal (q < 2^man_bits)
        // lands in exponent field 0, and q = 2^(man_bits+1) carries into the next binade.
        let code = (((te + self.bias - 1) as u32) << self.man_bits) + q;
        if code > self.max_code as u32 {
            sign | self.overflow_code(ovf)
        } else {
            sign | code as u8
        }
    }

    /// Rounds each `f32` to the nearest value of this format (RNE), in place, with `ovf` for
    /// overflow; NaN stays NaN (also for E2M1, where the `f32` keeps standing for "poisoned").
    ///
    /// Equal to `decode(encode(x))` for every non-NaN `x` (a property test checks it), but eight
    /// lanes at a time and branch-free: with `C = 2^(te − man_bits + 23)`, where `te` is `x`'s
    /// binade clamped to `[emin, emax + 1]`, the f32 sum `|x| + C` is rounded by the FPU (RNE)
    /// exactly onto the format's grid for that binade, and `(|x| + C) − C` is exact.
    pub fn round_slice(&self, x: &mut [f32], ovf: Overflow) {
        let emin_b = 1 - self.bias + 127;
        let emax1_b = self.emax + 1 + 127;
        let cshift = 23 - self.man_bits as i32;
        let max = self.max;
        let over = self.overflow_value(ovf);
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            let arr: [f32; 8] = (&*c).try_into().expect("8 lanes");
            let v = f32x8::new(arr);
            let a = v.abs();
            let sign = v ^ a;
            let bits: i32x8 = bytemuck::cast(a);
            let e: i32x8 = bits >> 23;
            let te = e.max(i32x8::splat(emin_b)).min(i32x8::splat(emax1_b));
            let cst: f32x8 = bytemuck::cast((te + i32x8::splat(cshift)) << 23);
            let r = (a + cst) - cst;
            // Mask lanes are all-ones or all-zeros, so a bit select is a lane select. NaN compares
            // false and stays NaN.
            let r = r
                .simd_gt(f32x8::splat(max))
                .bitselect(f32x8::splat(over), r);
            c.copy_from_slice(&(r | sign).to_array());
        }
        for v in chunks.into_remainder() {
            *v = self.round_one(*v, max, over, emin_b, emax1_b, cshift);
        }
    }

    /// Scalar lane of [`Spec::round_slice`] (same formula, for the tail).
    #[inline]
    fn round_one(
        &self,
        v: f32,
        max: f32,
        over: f32,
        emin_b: i32,
        emax1_b: i32,
        cshift: i32,
    ) -> f32 {
        let a = v.abs();
        let te = ((a.to_bits() >> 23) as i32).clamp(emin_b, emax1_b);
        let c = f32::from_bits(((te + cshift) as u32) << 23);
        let r = (a + c) - c;
        let r = if r > max { over } else { r };
        f32::from_bits(r.to_bits() | (v.to_bits() & 0x8000_0000))
    }
}

/// `m >> s`, rounded to nearest with ties to even (`s` ≤ 31).
#[inline]
pub(crate) fn rne_shift(m: u32, s: u32) -> u32 {
    if s == 0 {
        return m;
    }
    let q = m >> s;
    let rem = m & ((1u32 << s) - 1);
    let half = 1u32 << (s - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

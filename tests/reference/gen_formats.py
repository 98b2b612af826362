#!/usr/bin/env python3
"""Golden data for day0's number formats (accel-sim/src/formats), from independent implementations.

Writes tests/reference/golden/*.json, compared bit for bit by accel-sim/tests/formats_golden.rs.
See tests/reference/README.md for how to run it and what each file holds.

Independent implementations used:
  * ml_dtypes (float8_e4m3fn, float8_e5m2, float4_e2m1fn, float8_e8m0fnu, bfloat16) and numpy
    (float16) for every decode / encode;
  * Hugging Face transformers' `integrations/mxfp4.py::convert_moe_packed_tensors` (with torch)
    for the gpt-oss MXFP4 expert dequantization. If torch/transformers cannot be imported, a numpy
    transcription of that routine is used instead and the output records it (provenance.gpt_oss);
  * a numpy transcription of the OCP MX v1.0 quantization rule (spec section 6.3, with the
    zero/NaN/clamp conventions of microsoft/microxcaling `mx/mx_ops.py`), using ml_dtypes for the
    element rounding;
  * numpy for DeepSeek-V3 block-scaled FP8 dequantization (W = e4m3(q) * scale_inv[i//128, j//128]).

Deterministic: a fixed seed; rerunning with the same library versions gives identical files.
"""

import json
import os
import sys

import ml_dtypes as mld
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")
rng = np.random.default_rng(20240603)

E4M3, E5M2, E2M1, E8M0, BF16 = (
    mld.float8_e4m3fn,
    mld.float8_e5m2,
    mld.float4_e2m1fn,
    mld.float8_e8m0fnu,
    mld.bfloat16,
)
MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}
DT = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
EMAX = {"e2m1": 2, "e4m3": 8, "e5m2": 15}


def f32_bits(a):
    """float32 values as their bit patterns, flattened row-major."""
    return np.asarray(a, dtype=np.float32).view(np.uint32).reshape(-1).tolist()


def codes_u8(a):
    """ml_dtypes arrays -> their raw codes (the 4-bit type is stored one code per byte)."""
    return np.asarray(a).view(np.uint8).tolist()


def write(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# ---------------------------------------------------------------------------------------------
# 1. Every code decoded.
# ---------------------------------------------------------------------------------------------
def gen_codes():
    all8 = np.arange(256, dtype=np.uint8)
    return {
        "e4m3": f32_bits(all8.view(E4M3).astype(np.float32)),
        "e5m2": f32_bits(all8.view(E5M2).astype(np.float32)),
        "e2m1": f32_bits(np.arange(16, dtype=np.uint8).view(E2M1).astype(np.float32)),
        "e8m0": f32_bits(all8.view(E8M0).astype(np.float32)),
    }


# ---------------------------------------------------------------------------------------------
# 2. A few thousand f32 inputs encoded.
# ---------------------------------------------------------------------------------------------
def finite_values(dt):
    v = np.arange(256 if dt is not E2M1 else 16, dtype=np.uint8).view(dt).astype(np.float64)
    v = v[np.isfinite(v)]
    return np.unique(v)


def gen_inputs():
    vals = []
    f32 = np.float32
    # Every representable value, every midpoint between neighbours (the ties), and the f32
    # neighbours of both (just below / just above a tie).
    for dt in (E4M3, E5M2, E2M1):
        v = finite_values(dt)
        mids = (v[:-1] + v[1:]) / 2
        for x in np.concatenate([v, mids]).astype(f32):
            vals += [x, np.nextafter(x, f32(np.inf)), np.nextafter(x, f32(-np.inf))]
    # Overflow region of each format, and beyond.
    for x in [448, 449, 463.99, 464, 464.01, 465, 479, 480, 481, 500, 512, 1e4,
              57344, 59392, 61439, 61440, 61441, 65504, 65520, 1e5, 1e6,
              5, 5.5, 6, 6.5, 7, 7.5, 8, 100, 3.4028235e38]:
        vals += [f32(x)]
    # f32 subnormals, zeros, specials.
    vals += [f32(1e-45), f32(1e-40), f32(1.1754942e-38), f32(1.1754944e-38), f32(0.0), f32(-0.0)]
    vals += [f32(np.inf), f32(-np.inf), f32(np.nan)]
    vals += [np.uint32(0xFFC00000).view(f32), np.uint32(0x7F800001).view(f32)]  # -NaN, signalling NaN
    # E8M0 rounding: powers of two times {1, just under 1.5, 1.5, just over 1.5, just under 2},
    # across the whole range, including the bottom (2^-127 is an f32 subnormal) and the top.
    for e in list(range(-149, -120)) + list(range(-10, 11)) + list(range(120, 128)):
        for m in (1.0, 1.25, 1.4999999, 1.5, 1.5000001, 1.75, 1.9999999):
            x = np.float64(m) * np.float64(2.0) ** e
            if x < 3.4e38:
                vals += [f32(x)]
    # bf16 / f16 ties and overflow.
    for x in [1.00390625, 1.01171875, 65504, 65519.99, 65520, 3.3895314e38, 3.3961775e38, 2.0**-24, 2.0**-25, 3 * 2.0**-26]:
        vals += [f32(x)]
    # Random: log-uniform magnitudes 2^-30 .. 2^20, random signs.
    mags = np.exp2(rng.uniform(-30, 20, 1500))
    vals += list((mags * rng.choice([-1.0, 1.0], 1500)).astype(f32))
    # Random in the E2M1 / E4M3 working ranges, uniformly (many near-ties at low precision).
    vals += list(rng.uniform(-8, 8, 300).astype(f32))
    vals += list(rng.uniform(-520, 520, 300).astype(f32))
    # Both signs of everything deterministic above.
    a = np.array(vals, dtype=f32)
    a = np.concatenate([a, -a])
    # Deduplicate by bit pattern, keep order stable.
    _, idx = np.unique(a.view(np.uint32), return_index=True)
    return a[np.sort(idx)]


def sat_clip(x, mx):
    # Saturating policy, computed independently of day0: clamp to +-max (inf included), keep NaN,
    # then a plain RNE cast (which cannot overflow any more).
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), x, np.clip(x, -mx, mx)).astype(np.float32)


def gen_encode():
    np.seterr(all="ignore")  # overflow and NaN casts are the point here
    x = gen_inputs()
    out = {"inputs": f32_bits(x)}
    out["e4m3"] = codes_u8(x.astype(E4M3))
    out["e5m2"] = codes_u8(x.astype(E5M2))
    out["e2m1"] = codes_u8(x.astype(E2M1))
    out["e8m0"] = codes_u8(x.astype(E8M0))
    out["bf16"] = x.astype(BF16).view(np.uint16).tolist()
    out["f16"] = x.astype(np.float16).view(np.uint16).tolist()
    out["e4m3_sat"] = codes_u8(sat_clip(x, 448.0).astype(E4M3))
    out["e5m2_sat"] = codes_u8(sat_clip(x, 57344.0).astype(E5M2))
    out["e2m1_sat"] = codes_u8(sat_clip(x, 6.0).astype(E2M1))
    out["bf16_sat"] = sat_clip(x, float(mld.finfo(BF16).max)).astype(BF16).view(np.uint16).tolist()
    out["f16_sat"] = sat_clip(x, 65504.0).astype(np.float16).view(np.uint16).tolist()
    # E8M0 has no sign and no zero; saturation clamps into [2^-127, 2^127].
    with np.errstate(invalid="ignore"):
        e8 = np.where(np.isnan(x), x, np.clip(np.nan_to_num(x, posinf=2.0**127, neginf=0.0), 2.0**-127, 2.0**127))
    out["e8m0_sat"] = codes_u8(e8.astype(np.float32).astype(E8M0))
    return out


# ---------------------------------------------------------------------------------------------
# 3. MX quantization (OCP MX v1.0 section 6.3), numpy transcription.
# ---------------------------------------------------------------------------------------------
def mx_quantize_rows(x, elem):
    """x: float32 [rows, cols]; blocks of 32 along cols, each row zero-padded to whole blocks.
    Returns (scales u8 [rows, G], codes u8 [rows, G*32] one per element, dequant float32 [rows, cols])."""
    rows, cols = x.shape
    g = -(-cols // 32)
    xp = np.zeros((rows, g * 32), dtype=np.float64)
    xp[:, :cols] = x
    blocks = xp.reshape(rows, g, 32)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(blocks), axis=2)  # NaN propagates
    scales = np.zeros((rows, g), dtype=np.uint8)
    codes = np.zeros((rows, g, 32), dtype=np.uint8)
    deq = np.zeros((rows, g, 32), dtype=np.float64)
    for r in range(rows):
        for b in range(g):
            a = amax[r, b]
            if not np.isfinite(a):
                scales[r, b] = 0xFF  # NaN or inf in the block: NaN scale (microxcaling: log2 -> NaN/inf -> NaN)
                deq[r, b] = np.nan
                continue
            if a == 0:
                e = -127  # microxcaling: log2(FP32_MIN_NORMAL) - emax, clamped to -127
            else:
                _, ex = np.frexp(a)  # a = m * 2^ex, m in [0.5, 1): floor(log2 a) = ex - 1 (exact)
                e = max(int(ex) - 1 - EMAX[elem], -127)
            scales[r, b] = e + 127
            scaled = blocks[r, b] * np.float64(2.0) ** (-e)  # exact in float64
            q = np.clip(scaled, -MAX[elem], MAX[elem]).astype(DT[elem])  # saturating RNE
            codes[r, b] = q.view(np.uint8)
            deq[r, b] = q.astype(np.float64) * np.float64(2.0) ** e
    deq = deq.reshape(rows, g * 32)[:, :cols].astype(np.float32)
    return scales, codes.reshape(rows, g * 32), deq


def gen_mx():
    cases = []

    def add(elem, x, note):
        x = np.asarray(x, dtype=np.float32)
        s, c, d = mx_quantize_rows(x, elem)
        cases.append({
            "elem": elem, "note": note, "shape": list(x.shape), "input": f32_bits(x),
            "scales": s.reshape(-1).tolist(), "codes": c.reshape(-1).tolist(), "dequant": f32_bits(d),
        })

    for elem in ("e2m1", "e4m3", "e5m2"):
        # Random rows, each row at its own magnitude, ragged last block (cols = 70).
        x = rng.standard_normal((6, 70)) * np.exp2(rng.integers(-20, 20, (6, 1)))
        add(elem, x, "random normal rows at random magnitudes, ragged cols")
        # Special blocks, one per row of 32.
        sp = np.zeros((9, 32))
        sp[0] = 0.0                                                 # all zero
        sp[1] = rng.uniform(-1, 1, 32); sp[1, 5] = 7.0              # amax 7: saturates (E2M1)
        sp[2] = rng.uniform(-1, 1, 32) * 1e-40                      # f32 subnormals: scale clamps to 2^-127
        sp[3] = rng.uniform(-1, 1, 32) * 3e38                       # near f32 max
        sp[4] = rng.uniform(-1, 1, 32); sp[4, 3] = np.nan           # NaN in block
        sp[5] = rng.uniform(-1, 1, 32); sp[5, 9] = -np.inf          # inf in block
        sp[6] = np.linspace(-6, 6, 32)                              # exact grid values
        sp[7] = rng.uniform(-1, 1, 32) * 2.0**-120                  # scale near the bottom of E8M0
        sp[8] = rng.uniform(-1.99, 1.99, 32) * 2.0**100             # large
        add(elem, sp, "special blocks: zero, 7, subnormal, huge, NaN, inf, grid, tiny, large")
    return cases


# ---------------------------------------------------------------------------------------------
# 4. gpt-oss MXFP4 experts, dequantized by transformers' own routine.
# ---------------------------------------------------------------------------------------------
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def convert_moe_packed_tensors_numpy(blocks, scales):
    """Line-by-line numpy transcription of transformers `integrations/mxfp4.py`
    `_convert_moe_packed_tensors` (transformers 5.x; the same in 4.55+), used only when torch or
    transformers cannot be imported. dtype is float32 here; transformers' default bf16 holds the
    same values for scales 0..254 (2 significant bits, exponent within bf16 range)."""
    scales = scales.astype(np.int32) - 127
    assert blocks.shape[:-1] == scales.shape
    lut = np.array(FP4_VALUES, dtype=np.float32)
    *prefix_shape, G, B = blocks.shape
    rows_total = int(np.prod(prefix_shape)) * G
    blocks = blocks.reshape(rows_total, B)
    scales = scales.reshape(rows_total, 1)
    out = np.empty((rows_total, B * 2), dtype=np.float32)
    out[:, 0::2] = lut[(blocks & 0x0F).astype(np.int64)]
    out[:, 1::2] = lut[(blocks >> 4).astype(np.int64)]
    with np.errstate(over="ignore"):
        out = np.ldexp(out, scales).astype(np.float32)  # torch.ldexp(sub, exp, out=sub)
    out = out.reshape(*prefix_shape, G, B * 2).reshape(*prefix_shape, G * B * 2)
    return np.ascontiguousarray(np.swapaxes(out, 1, 2))


def gen_gpt_oss():
    try:
        import torch
        import transformers
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        def dequant(b, s):
            o16 = convert_moe_packed_tensors(torch.from_numpy(b.copy()), torch.from_numpy(s.copy()))
            o32 = convert_moe_packed_tensors(torch.from_numpy(b.copy()), torch.from_numpy(s.copy()), dtype=torch.float32)
            assert o16.dtype == torch.bfloat16
            # The default (bf16) output holds exactly the float32 output: check, then store f32.
            assert torch.equal(o16.float(), o32), "bf16 and f32 outputs differ"
            ref = convert_moe_packed_tensors_numpy(b, s)
            assert np.array_equal(ref.view(np.uint32), o32.numpy().view(np.uint32)), "numpy transcription differs"
            return o32.numpy()

        impl = f"transformers {transformers.__version__} convert_moe_packed_tensors (torch {torch.__version__})"
    except ImportError as e:  # pragma: no cover - depends on the machine
        print(f"torch/transformers unavailable ({e}); using the numpy transcription", file=sys.stderr)
        dequant = convert_moe_packed_tensors_numpy
        impl = "numpy transcription of transformers convert_moe_packed_tensors"

    cases = []
    for shape in ([2, 3, 2, 16], [3, 5, 3, 16], [1, 4, 1, 16], [2, 2, 3, 2, 16]):
        blocks = rng.integers(0, 256, shape, dtype=np.uint8)
        scales = rng.integers(117, 138, shape[:-1], dtype=np.uint8)
        flat = scales.reshape(-1)
        flat[0] = 0     # smallest scale, 2^-127 (f32 subnormal products)
        flat[-1] = 254  # largest, 2^127 (6 * 2^127 overflows to inf, in transformers too)
        out = dequant(blocks, scales)
        cases.append({
            "blocks_shape": shape, "blocks_hex": blocks.tobytes().hex(),
            "scales_shape": shape[:-1], "scales": scales.reshape(-1).tolist(),
            "out_shape": list(out.shape), "out": f32_bits(out),
        })
    return impl, cases


# ---------------------------------------------------------------------------------------------
# 5. DeepSeek-V3 block-scaled FP8 weights.
# ---------------------------------------------------------------------------------------------
def gen_fp8_block():
    rows, cols, blk = 130, 132, 128  # ragged: edge blocks of 2 rows and 4 columns
    q = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    q[q & 0x7F == 0x7F] = 0x3C  # keep NaN codes out of the weight
    sr, sc = -(-rows // blk), -(-cols // blk)
    s = (np.exp2(rng.uniform(-14, -4, (sr, sc)))).astype(np.float32)
    full = np.repeat(np.repeat(s, blk, 0), blk, 1)[:rows, :cols]
    w = q.view(E4M3).astype(np.float32) * full  # one f32 multiply, RNE
    return {
        "shape": [rows, cols], "block": blk, "weight_hex": q.tobytes().hex(),
        "scale_shape": [sr, sc], "scale_inv": f32_bits(s), "out_hex": w.astype("<f4").tobytes().hex(),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    impl, gpt = gen_gpt_oss()
    prov = {
        "generator": "tests/reference/gen_formats.py",
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "ml_dtypes": mld.__version__,
        "gpt_oss": impl,
    }
    write("codes.json", {"provenance": prov, **gen_codes()})
    write("encode.json", {"provenance": prov, **gen_encode()})
    write("mx_quant.json", {"provenance": prov, "cases": gen_mx()})
    write("gpt_oss_mxfp4.json", {"provenance": prov, "cases": gpt})
    write("fp8_block.json", {"provenance": prov, **gen_fp8_block()})


if __name__ == "__main__":
    main()

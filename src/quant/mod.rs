//! Pure quantization math: FP8 e4m3fn codec, BF16 rounding, FP4 (NVFP4, MXFP4) and INT4 group schemes (round-to-nearest, importance-weighted,
//! GPTQ) and packing. No files, no printing.

pub mod fp4;
pub mod fp8;
pub mod fp8_block;
pub mod gptq;
mod gptq_linalg;
pub mod imatrix;
pub mod int4;
pub mod int4_code;
pub mod mse;
pub mod pack;
pub mod pow;
pub mod scale_rule;
pub mod w4a8;

pub use scale_rule::ScaleRule;

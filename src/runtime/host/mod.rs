//! Host f32 kernels shared by the CPU backend and the ops every backend computes on the host (KDA): `e^x` that
//! vectorizes with the same bits on every instruction set, and the broadcast GEMM.

pub mod exp;
pub mod gemm;

//! The kernels/ module as built by scripts/check-kernels.sh and committed under kernels/build/, embedded here:
//! sm_90a cubins (loaded on compute capability 9.0) and sm_90 PTX (JIT-compiled by the driver on newer GPUs).

/// One compiled op family.
pub struct Artifact {
    pub family: &'static str,
    pub cubin_sm90a: &'static [u8],
    pub ptx_sm90: &'static str,
}

pub const ARTIFACTS: [Artifact; 2] = [
    Artifact {
        family: "fp8_dequant",
        cubin_sm90a: include_bytes!("../../kernels/build/fp8_dequant.sm_90a.cubin"),
        ptx_sm90: include_str!("../../kernels/build/fp8_dequant.sm_90.ptx"),
    },
    Artifact {
        family: "int4_quantize",
        cubin_sm90a: include_bytes!("../../kernels/build/int4_quantize.sm_90a.cubin"),
        ptx_sm90: include_str!("../../kernels/build/int4_quantize.sm_90.ptx"),
    },
];

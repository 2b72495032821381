//! The kernels/ module as built by scripts/check-kernels.sh and committed under kernels/build/, embedded here:
//! sm_90a cubins (loaded on compute capability 9.0) and sm_90 PTX (JIT-compiled by the driver on newer GPUs).
//! One entry per kernels/*.cu (check-kernels.sh fails when one is missing).

/// One compiled op family.
pub struct Artifact {
    pub family: &'static str,
    pub cubin_sm90a: &'static [u8],
    pub ptx_sm90: &'static str,
}

pub const ARTIFACTS: [Artifact; 16] = [
    Artifact {
        family: "activation",
        cubin_sm90a: include_bytes!("../../../kernels/build/activation.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/activation.sm_90.ptx"),
    },
    Artifact {
        family: "attention",
        cubin_sm90a: include_bytes!("../../../kernels/build/attention.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/attention.sm_90.ptx"),
    },
    Artifact {
        family: "fp4_dequant",
        cubin_sm90a: include_bytes!("../../../kernels/build/fp4_dequant.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/fp4_dequant.sm_90.ptx"),
    },
    Artifact {
        family: "fp8_dequant",
        cubin_sm90a: include_bytes!("../../../kernels/build/fp8_dequant.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/fp8_dequant.sm_90.ptx"),
    },
    Artifact {
        family: "gptq",
        cubin_sm90a: include_bytes!("../../../kernels/build/gptq.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/gptq.sm_90.ptx"),
    },
    Artifact {
        family: "indexer",
        cubin_sm90a: include_bytes!("../../../kernels/build/indexer.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/indexer.sm_90.ptx"),
    },
    Artifact {
        family: "int4_quantize",
        cubin_sm90a: include_bytes!("../../../kernels/build/int4_quantize.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/int4_quantize.sm_90.ptx"),
    },
    Artifact {
        family: "kv_write",
        cubin_sm90a: include_bytes!("../../../kernels/build/kv_write.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/kv_write.sm_90.ptx"),
    },
    Artifact {
        family: "linear",
        cubin_sm90a: include_bytes!("../../../kernels/build/linear.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/linear.sm_90.ptx"),
    },
    Artifact {
        family: "norm",
        cubin_sm90a: include_bytes!("../../../kernels/build/norm.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/norm.sm_90.ptx"),
    },
    Artifact {
        family: "paged_attention",
        cubin_sm90a: include_bytes!("../../../kernels/build/paged_attention.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/paged_attention.sm_90.ptx"),
    },
    Artifact {
        family: "paged_mla_decode",
        cubin_sm90a: include_bytes!("../../../kernels/build/paged_mla_decode.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/paged_mla_decode.sm_90.ptx"),
    },
    Artifact {
        family: "rope",
        cubin_sm90a: include_bytes!("../../../kernels/build/rope.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/rope.sm_90.ptx"),
    },
    Artifact {
        family: "routing",
        cubin_sm90a: include_bytes!("../../../kernels/build/routing.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/routing.sm_90.ptx"),
    },
    Artifact {
        family: "w4a16",
        cubin_sm90a: include_bytes!("../../../kernels/build/w4a16.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/w4a16.sm_90.ptx"),
    },
    Artifact {
        family: "tensor",
        cubin_sm90a: include_bytes!("../../../kernels/build/tensor.sm_90a.cubin"),
        ptx_sm90: include_str!("../../../kernels/build/tensor.sm_90.ptx"),
    },
];

/// Every kernel the embedded modules must export (looked up when the GPU opens; the rest on first launch).
pub const KERNELS: [&str; 8] = [
    "fp8_block_dequant_f32",
    "fp8_block_dequant_bf16",
    "int4_quantize_fp8_g32",
    "int4_quantize_fp8_g64",
    "int4_quantize_fp8_gany",
    "int4_quantize_f32_g32",
    "int4_quantize_f32_g64",
    "int4_quantize_f32_gany",
];

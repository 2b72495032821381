//! On-disk conventions, each in one file with its reader and writer side by side: block-FP8 source checkpoints
//! ([`fp8_block`]), the compressed-tensors output format ([`compressed_tensors`]) and FP8 KV-cache scales
//! ([`kv_scales`]). Jobs and the runtime import these; a format imports no job and no runtime.

pub mod compressed_tensors;
pub mod fp8_block;
pub mod kv_scales;

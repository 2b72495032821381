//! On-disk conventions, each in one file with its reader and writer side by side: block-FP8 source checkpoints
//! ([`vendor_source`]), MXFP4 modules as the FP4-native releases ship them ([`mxfp4_source`]), the compressed-tensors output format ([`compressed_tensors`]) and FP8 KV-cache scales
//! ([`kv_scales`]). Jobs and the runtime import these; a format imports no job and no runtime.

pub mod compressed_tensors;
pub mod kv_scales;
pub mod mxfp4_source;
pub mod row_reader;
pub mod vendor_source;

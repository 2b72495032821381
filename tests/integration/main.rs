//! Integration tests: drive the built `squeeze` binary on tiny synthetic checkpoints and check exit codes,
//! stdout and stderr. One test binary; one module per subcommand.

mod bad_input;
mod calib_parts;
mod calibrate;
mod card;
mod cluster;
mod common;
mod cuda_backend;
mod cuda_decode;
mod demo;
mod device_ops;
mod eval;
mod eval_parts;
mod formats;
mod fp4_sources;
mod golden;
mod gptq;
mod hub;
mod imatrix;
mod lint;
mod messages;
mod mtp;
mod mtp_chain;
mod paged;
mod parity;
mod parity_plot;
mod parts;
mod peers;
mod quantize;
mod releases;
mod reliability;
mod report;
mod requantize;
mod serve;
mod tokenizer;
mod vllm_golden;

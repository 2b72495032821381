//! A model folder loaded onto the runtime, the floor between the runtime (which knows ops, tensors, matrices and
//! the KV pool, not model folders) and the architectures: the folder opened and checked before any layer is read
//! ([`open`]: no unfinished folder edit, a config, a router the runtime implements, tensors that match the config
//! by [`validate`], which `quantize`'s plan and `verify` use too), one weight of any checkpoint squeeze reads or writes read as a runtime
//! [`crate::runtime::Matrix`] ([`weights`]: f32, packed INT4, block FP8, FP4, W4A8), and the decoder layers streamed
//! one at a time, layer `i + 1` read while layer `i` runs (on a device: `i + 2` read while `i + 1` uploads)
//! ([`layer_stream`]).

pub mod error;
pub mod layer_stream;
pub mod open;
pub mod validate;
pub mod weights;

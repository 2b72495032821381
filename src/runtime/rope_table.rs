//! RoPE tables: `cos`/`sin` of every position and rotary frequency, computed in f64 and stored as f32 like torch's
//! buffers. The frequencies come from the model's config ([`crate::arch::rope`]: default and YaRN).

use super::error::RuntimeError;
use super::matrix::Matrix;

/// `cos`/`sin` for positions `0..positions`, `[positions, rotary_dim/2]`, scaled by YaRN's attention factor.
#[derive(Debug, Clone)]
pub struct RopeTable {
    pub rotary_dim: usize,
    pub positions: usize,
    /// `[positions, rotary_dim/2]` (a matrix so a device backend keeps it resident like a weight).
    pub cos: Matrix,
    pub sin: Matrix,
}

impl RopeTable {
    /// The table for `positions` positions of the inverse `frequencies` (one per rotary pair), `cos`/`sin` scaled by
    /// `attention`.
    pub fn new(frequencies: &[f32], attention: f64, positions: usize) -> Self {
        Self::of_positions(frequencies, attention, 0..positions)
    }

    /// The table whose row `i` holds the `i`-th of `positions` (a decode step's few positions, not `0..n`).
    pub fn of_positions(frequencies: &[f32], attention: f64, positions: impl ExactSizeIterator<Item = usize>) -> Self {
        let (half, count) = (frequencies.len(), positions.len());
        let mut cos = Vec::with_capacity(count * half);
        let mut sin = Vec::with_capacity(count * half);
        for position in positions {
            for frequency in frequencies {
                let angle = position as f32 * frequency;
                cos.push(((angle as f64).cos() * attention) as f32);
                sin.push(((angle as f64).sin() * attention) as f32);
            }
        }
        Self {
            rotary_dim: 2 * half,
            positions: count,
            cos: Matrix::new(count, half, cos),
            sin: Matrix::new(count, half, sin),
        }
    }
}

/// Refuses a sequence longer than the positions `table` was built for.
pub fn check_positions(table: &RopeTable, length: usize) -> Result<(), RuntimeError> {
    if length > table.positions {
        return Err(RuntimeError::Input(format!(
            "a sequence of {length} tokens is longer than the {} positions the runtime was opened for",
            table.positions
        )));
    }
    Ok(())
}

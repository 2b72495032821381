//! Where each sequence of a batch lies in its rows: `[start, start + length)` per sequence.

/// Token positions of each sequence inside the flat `[tokens, width]` activations of a batch.
#[derive(Debug, Clone)]
pub struct Spans {
    pub starts: Vec<usize>,
    pub lengths: Vec<usize>,
}

impl Spans {
    pub fn new(lengths: &[usize]) -> Self {
        let mut starts = Vec::with_capacity(lengths.len());
        let mut next = 0;
        for length in lengths {
            starts.push(next);
            next += length;
        }
        Self { starts, lengths: lengths.to_vec() }
    }

    pub fn total(&self) -> usize {
        self.lengths.iter().sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.starts.iter().copied().zip(self.lengths.iter().copied())
    }
}

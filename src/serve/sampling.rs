//! Next-token choice: greedy (argmax, lowest id on ties) by default, or temperature + top-p (nucleus) sampling from
//! a per-request seeded generator, so a request samples the same tokens whatever else is in the batch.

pub use crate::metrics::argmax;
pub use crate::rng::Rng;

/// How tokens are chosen.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
}

impl Sampling {
    pub fn choose(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        if self.temperature <= 0.0 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut weights: Vec<(f64, u32)> = logits
            .iter()
            .enumerate()
            .map(|(id, &l)| ((((l - max) / self.temperature) as f64).exp(), id as u32))
            .collect();
        weights.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let total: f64 = weights.iter().map(|w| w.0).sum();
        let mut kept = 0.0;
        let mut cut = weights.len();
        for (index, (weight, _)) in weights.iter().enumerate() {
            kept += weight / total;
            if kept >= self.top_p as f64 {
                cut = index + 1;
                break;
            }
        }
        let nucleus = &weights[..cut];
        let mass: f64 = nucleus.iter().map(|w| w.0).sum();
        let mut target = rng.unit() * mass;
        for &(weight, id) in nucleus {
            if target < weight {
                return id;
            }
            target -= weight;
        }
        nucleus[nucleus.len() - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_ties_and_top_p_one_token() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        let sampling = Sampling { temperature: 0.7, top_p: 0.01 };
        let mut rng = Rng::new(5);
        for _ in 0..10 {
            assert_eq!(sampling.choose(&[0.1, 2.0, 1.9, -4.0], &mut rng), 1);
        }
    }
}

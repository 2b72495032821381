//! The abstract output the rules read: `config.json` plus, per tensor, its name, dtype, shape and (when the
//! caller has the bytes) a summary of its values — made from a quantize plan or from a written folder.

use serde_json::Value;

use crate::io::dtype::Dtype;

/// What the rules know about one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorFacts {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// `None` when the values are not known (a plan, before anything is written).
    pub values: Option<Values>,
}

/// A summary of a tensor's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Float values: how many, the first (a scalar's value), and the first that is not finite and positive
    /// (index, value).
    Floats { count: usize, first: Option<f32>, first_bad: Option<(usize, f32)> },
    /// Small integer tensors (`weight_shape`), all values.
    Ints(Vec<i64>),
}

impl Values {
    /// Summarises float values.
    pub fn floats(values: impl IntoIterator<Item = f32>) -> Values {
        let mut count = 0;
        let (mut first, mut first_bad) = (None, None);
        for (index, value) in values.into_iter().enumerate() {
            count += 1;
            first = first.or(Some(value));
            if first_bad.is_none() && !(value.is_finite() && value > 0.0) {
                first_bad = Some((index, value));
            }
        }
        Values::Floats { count, first, first_bad }
    }
}

/// An output as the engines would see it.
#[derive(Debug, Clone, Default)]
pub struct OutputDescription {
    /// `config.json` (`Value::Null` when there is none).
    pub config: Value,
    pub tensors: Vec<TensorFacts>,
}

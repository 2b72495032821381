//! The token chunks a job runs through a model (`eval`, parity, `calibrate-kv`): a text file tokenized with the
//! model's tokenizer and cut into `ctx`-token chunks, or a safetensors file holding `input_ids` `[n, ctx]` (I32 or
//! I64), used as given (no BOS added).

use std::path::{Path, PathBuf};

use crate::io::ShardFile;
use crate::model::config::ContextWindow;
use crate::model::tokenizer::Tokenizer;

/// Where the tokens come from, and the flags that gave them (errors name the flag and the file).
#[derive(Debug, Clone)]
pub enum EvalInput {
    /// UTF-8 text, tokenized with the model's tokenizer and cut into `ctx`-token chunks; `flag` gave the file
    /// (`--data`), `ctx_flag` the length (`--ctx`).
    Text { path: PathBuf, ctx: usize, flag: &'static str, ctx_flag: &'static str },
    /// A safetensors file with an integer tensor `input_ids` `[n, ctx]` (I32 or I64), given by `flag` (`--tokens`).
    Tokens { path: PathBuf, flag: &'static str },
}

impl EvalInput {
    /// The input as messages name it: `--data corpus.txt`.
    pub fn describe(&self) -> String {
        match self {
            EvalInput::Text { path, flag, .. } | EvalInput::Tokens { path, flag } => {
                format!("{flag} {}", path.display())
            }
        }
    }

    /// The chunk length as messages name it: `--ctx 512`, or `--tokens FILE (rows of 512 tokens)`.
    fn length(&self, ctx: usize) -> String {
        match self {
            EvalInput::Text { ctx_flag, .. } => format!("{ctx_flag} {ctx}"),
            EvalInput::Tokens { .. } => format!("{} (rows of {ctx} tokens)", self.describe()),
        }
    }
}

/// Why the chunks could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error(transparent)]
    Tokenizer(#[from] crate::model::tokenizer::TokenizerError),
    #[error("{0}")]
    Input(String),
}

/// Non-overlapping `ctx`-token chunks of a UTF-8 text file; a shorter tail is dropped. `flag`/`ctx_flag` name the
/// file's and the length's flags in errors.
fn chunks_from_text(
    model: &Path,
    text_file: &Path,
    ctx: usize,
    flag: &str,
    ctx_flag: &str,
) -> Result<Vec<Vec<u32>>, ChunkError> {
    let text = std::fs::read_to_string(text_file)
        .map_err(|e| ChunkError::Input(format!("{flag} {}: {e} (expected a UTF-8 text file)", text_file.display())))?;
    let tokenizer = Tokenizer::from_dir(model)?;
    let ids = tokenizer.encode(&text)?;
    if ctx < 2 {
        return Err(ChunkError::Input(format!("{ctx_flag}: must be at least 2, got {ctx}")));
    }
    if ids.len() < ctx {
        return Err(ChunkError::Input(format!(
            "{flag} {}: {} tokens, fewer than one chunk of {ctx_flag} {ctx}; use a longer text or a smaller {ctx_flag}",
            text_file.display(),
            ids.len()
        )));
    }
    Ok(ids.chunks_exact(ctx).map(<[u32]>::to_vec).collect())
}

/// The rows of `input_ids` in a safetensors file; errors name the file as `flag FILE`.
pub fn read_token_file(path: &Path, flag: &str) -> Result<Vec<Vec<u32>>, ChunkError> {
    let named = |problem: String| ChunkError::Input(format!("{flag} {}: {problem}", path.display()));
    let file = ShardFile::open(path)?;
    let tensor = file
        .get("input_ids")
        .ok_or_else(|| named("has no tensor `input_ids`; write input_ids [n, ctx] as I32 or I64".into()))?;
    let [rows, ctx] = match tensor.shape {
        [rows, ctx] => [*rows, *ctx],
        other => return Err(named(format!("tensor `input_ids` has shape {other:?}, expected [n, ctx]"))),
    };
    let values: Vec<i64> = match crate::io::dtype::integers(tensor.dtype, tensor.bytes) {
        Some(values) => values,
        None => {
            let other = tensor.dtype;
            return Err(named(format!("tensor `input_ids` has dtype {other}, expected I32 or I64")));
        }
    };
    if let Some(index) = values.iter().position(|v| *v < 0 || *v > u32::MAX as i64) {
        return Err(named(format!(
            "input_ids[{}, {}] is {}, which is not a token id",
            index / ctx.max(1),
            index % ctx.max(1),
            values[index]
        )));
    }
    let ids: Vec<u32> = values.into_iter().map(|v| v as u32).collect();
    Ok(if ctx == 0 { vec![Vec::new(); rows] } else { ids.chunks(ctx).map(<[u32]>::to_vec).collect() })
}

/// What the chunks must fit: the model's vocabulary, its context window(s) (parity: both models'), and the fewest
/// tokens a chunk may hold.
pub struct Fit<'a> {
    pub vocab: usize,
    pub windows: &'a [&'a ContextWindow],
    /// Fewest tokens per chunk: 2 (one scored position), 4 for parity (half prompt, two scored).
    pub min_ctx: usize,
    /// `--allow-long-context`: chunks longer than a window run, with a warning instead of an error.
    pub allow_long_context: bool,
}

/// The chunks of an input, and the warnings of running them (chunks beyond the window under
/// `--allow-long-context`).
#[derive(Debug, Clone)]
pub struct Chunks {
    pub sequences: Vec<Vec<u32>>,
    pub warnings: Vec<String>,
}

/// Reads `input` (text tokenized with the tokenizer in `model`, or a token file), keeps at most `limit` chunks and
/// checks them against `fit`: at least one chunk, of at least `min_ctx` tokens, within the context window(s), every
/// id inside the vocabulary. Errors name the flag, the file and, for a bad id, its row and column.
pub fn load_sequences(input: &EvalInput, model: &Path, limit: Option<usize>, fit: &Fit) -> Result<Chunks, ChunkError> {
    let mut sequences = match input {
        EvalInput::Text { path, ctx, flag, ctx_flag } => chunks_from_text(model, path, *ctx, flag, ctx_flag)?,
        EvalInput::Tokens { path, flag } => read_token_file(path, flag)?,
    };
    if let Some(limit) = limit {
        sequences.truncate(limit.max(1));
    }
    let named = |problem: String| ChunkError::Input(format!("{}: {problem}", input.describe()));
    if sequences.is_empty() {
        return Err(named(
            "tensor `input_ids` has no rows, so there are no chunks to evaluate; write at least one row of token ids"
                .into(),
        ));
    }
    let ctx = sequences[0].len();
    let min_ctx = fit.min_ctx;
    if ctx < min_ctx {
        return Err(ChunkError::Input(match input {
            EvalInput::Text { ctx_flag, .. } => format!(
                "{ctx_flag} {ctx}: chunks of {ctx} token(s) are too short: this needs at least {min_ctx} per chunk; use a larger {ctx_flag}"
            ),
            EvalInput::Tokens { .. } => format!(
                "{}: rows of {ctx} token(s) are too short: this needs at least {min_ctx} per chunk; write rows of at least {min_ctx} token ids",
                input.describe()
            ),
        }));
    }
    let mut warnings = Vec::new();
    for window in fit.windows {
        if let Some(warning) =
            window.check(&input.length(ctx), ctx, fit.allow_long_context).map_err(ChunkError::Input)?
        {
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
    }
    let vocab = fit.vocab;
    for (row, sequence) in sequences.iter().enumerate() {
        if let Some(column) = sequence.iter().position(|&id| id as usize >= vocab) {
            let id = sequence[column];
            return Err(named(match input {
                EvalInput::Tokens { .. } => format!(
                    "input_ids[{row}, {column}] is {id}, outside the model's vocabulary of {vocab} (config.json vocab_size); the tokens were made for another model"
                ),
                EvalInput::Text { .. } => format!(
                    "token id {id} (chunk {row}, position {column}) is outside the model's vocabulary of {vocab} (config.json vocab_size): the model's tokenizer and config.json disagree"
                ),
            }));
        }
    }
    Ok(Chunks { sequences, warnings })
}

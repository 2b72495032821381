//! What a GPU checks or assumes at a launch, checked by the emulated device so that a launch a GPU would refuse or
//! misread fails in `cargo test`, not first on a lent GPU. From the compiled artifacts (kernels/build/*.ptx: what a
//! GPU loads, not the sources the emulator compiles):
//! - the kernel exists there;
//! - the block holds no more threads than its `__launch_bounds__` (`.maxntid`; 1024 without), and grid and block
//!   stay inside compute capability 9.0's dimensions, and its dynamic shared memory inside a block's 227 KiB;
//! - each argument has its parameter's width: the driver copies as many bytes as the PTX parameter has from each
//!   argument's address, so an `i32` passed for a `long long` would be read with 4 bytes of garbage (the emulator
//!   converts every integer to the C++ parameter's type and would not notice).

use std::collections::HashMap;
use std::path::Path;

use super::{Arg, CudaError, LaunchShape, MAX_DYNAMIC_SHARED_BYTES};

/// Threads per block a kernel without `__launch_bounds__` may take.
const MAX_BLOCK_THREADS: u32 = 1024;
/// Block dimensions x, y, z.
const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// Grid dimensions x, y, z.
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// The emulator's own test kernels (kernels/emulation/server.cpp) have no GPU artifact.
const EMULATION_ONLY: &str = "emulation_";

/// One kernel's launch contract.
#[derive(Debug)]
struct Entry {
    max_threads: u32,
    /// The PTX type of each parameter (`.u64`, `.u32`, `.f32`, …).
    params: Vec<String>,
}

/// The kernels of the compiled artifacts.
#[derive(Debug, Default)]
pub struct LaunchCheck {
    entries: HashMap<String, Entry>,
}

/// The PTX parameter types an argument may fill: its width and kind.
fn fits(arg: &Arg, param: &str) -> bool {
    match arg {
        Arg::Buffer(_) | Arg::At(..) | Arg::Null | Arg::I64(_) => matches!(param, ".u64" | ".s64" | ".b64"),
        Arg::I32(_) | Arg::U32(_) => matches!(param, ".u32" | ".s32" | ".b32"),
        Arg::F32(_) => param == ".f32",
        Arg::F64(_) => param == ".f64",
    }
}

fn describe(arg: &Arg) -> &'static str {
    match arg {
        Arg::Buffer(_) | Arg::At(..) => "a pointer",
        Arg::Null => "a null pointer",
        Arg::I64(_) => "an i64",
        Arg::I32(_) => "an i32",
        Arg::U32(_) => "a u32",
        Arg::F32(_) => "an f32",
        Arg::F64(_) => "an f64",
    }
}

impl LaunchCheck {
    /// The kernels of every `*.ptx` in `dir` (kernels/build/).
    pub fn from_dir(dir: &Path) -> Result<LaunchCheck, CudaError> {
        let unreadable = |e: std::io::Error| {
            CudaError::Module(format!(
                "the emulated device checks launches against the compiled kernels in {} ({e}); run \
                 scripts/check-kernels.sh --update",
                dir.display()
            ))
        };
        let mut check = LaunchCheck::default();
        for entry in std::fs::read_dir(dir).map_err(unreadable)? {
            let path = entry.map_err(unreadable)?.path();
            if path.extension().is_some_and(|extension| extension == "ptx") {
                check.add_ptx(&std::fs::read_to_string(&path).map_err(unreadable)?);
            }
        }
        Ok(check)
    }

    /// Adds the entries of one PTX module: `.visible .entry NAME(`, one `.param .TYPE NAME_param_I` line per
    /// parameter, `)`, then `.maxntid X, Y, Z` when the kernel has launch bounds, then its body from `{`.
    pub fn add_ptx(&mut self, ptx: &str) {
        let mut current: Option<&str> = None;
        for line in ptx.lines() {
            let trimmed = line.trim();
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                let name = rest.split('(').next().unwrap_or(rest).trim();
                self.entries.insert(name.to_string(), Entry { max_threads: MAX_BLOCK_THREADS, params: Vec::new() });
                current = Some(name);
            } else if let Some(entry) = current.and_then(|name| self.entries.get_mut(name)) {
                if let Some(param) = trimmed.strip_prefix(".param ") {
                    entry.params.push(param.split_whitespace().next().unwrap_or_default().to_string());
                } else if let Some(bounds) = trimmed.strip_prefix(".maxntid ") {
                    entry.max_threads = bounds.split(',').map(|n| n.trim().parse::<u32>().unwrap_or(1)).product();
                } else if trimmed.starts_with('{') {
                    current = None;
                }
            }
        }
    }

    /// Refuses what a GPU would refuse or misread: an unknown kernel, a block past its bounds, a dimension out of
    /// range, more shared memory than a block has, arguments that are not the parameters' number and widths.
    pub fn check(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError> {
        let refuse = |message: String| {
            Err(CudaError::Driver { call: "cuLaunchKernel", message: format!("kernel `{kernel}`: {message}") })
        };
        let (max_threads, params) = match self.entries.get(kernel) {
            Some(entry) => (entry.max_threads, Some(&entry.params)),
            None if kernel.starts_with(EMULATION_ONLY) => (MAX_BLOCK_THREADS, None),
            None => {
                return refuse(
                    "not in the compiled kernels (kernels/build/*.ptx); run scripts/check-kernels.sh --update".into(),
                )
            }
        };
        let [grid, block] = [shape.grid, shape.block];
        for axis in 0..3 {
            if grid[axis] == 0 || grid[axis] > MAX_GRID[axis] || block[axis] == 0 || block[axis] > MAX_BLOCK[axis] {
                return refuse(format!("grid {grid:?} × block {block:?} is outside the GPU's launch dimensions"));
            }
        }
        if shape.shared_bytes > MAX_DYNAMIC_SHARED_BYTES {
            return refuse(format!(
                "{} bytes of dynamic shared memory exceed a block's {MAX_DYNAMIC_SHARED_BYTES}",
                shape.shared_bytes
            ));
        }
        let threads: u64 = block.iter().map(|&n| u64::from(n)).product();
        if threads > u64::from(max_threads) {
            return refuse(format!(
                "a block of {threads} threads exceeds its limit of {max_threads} (__launch_bounds__, or 1024); a GPU \
                 refuses this launch"
            ));
        }
        let Some(params) = params else { return Ok(()) };
        if args.len() != params.len() {
            return refuse(format!("{} arguments for {} parameters", args.len(), params.len()));
        }
        for (index, (arg, param)) in args.iter().zip(params).enumerate() {
            if !fits(arg, param) {
                return refuse(format!(
                    "argument {index} is {} but the parameter is `{param}`; a GPU would read it with the wrong width",
                    describe(arg)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
.visible .entry bounded(
\t.param .u64 bounded_param_0,
\t.param .u32 bounded_param_1,
\t.param .f32 bounded_param_2
)
.maxntid 128, 1, 1
{
\t.param .b32 retval0;
\tret;
}
.visible .entry unbounded(
\t.param .u64 unbounded_param_0
)
{
\tret;
}
";

    #[test]
    fn launches_a_gpu_would_refuse_or_misread_are_refused() {
        let mut check = LaunchCheck::default();
        check.add_ptx(PTX);
        let args = [Arg::Null, Arg::I32(3), Arg::F32(0.5)];
        assert!(check.check("bounded", LaunchShape::linear(10, 128), &args).is_ok());
        let refused = check.check("bounded", LaunchShape::linear(10, 256), &args).unwrap_err().to_string();
        assert!(refused.contains("`bounded`") && refused.contains("256 threads exceeds its limit of 128"), "{refused}");
        let wide = check.check("bounded", LaunchShape::linear(1, 32), &[Arg::Null, Arg::I64(3), Arg::F32(0.5)]);
        let wide = wide.unwrap_err().to_string();
        assert!(wide.contains("argument 1 is an i64 but the parameter is `.u32`"), "{wide}");
        assert!(check.check("bounded", LaunchShape::linear(1, 32), &args[..2]).is_err());
        assert!(check.check("unbounded", LaunchShape::linear(1, 1024), &[Arg::I64(1)]).is_ok());
        assert!(check.check("unbounded", LaunchShape::linear(1, 32), &[Arg::I32(1)]).is_err());
        let [square, tall, empty] = [[32, 32, 2], [32, 1, 1], [0, 1, 1]];
        assert!(check
            .check("unbounded", LaunchShape { grid: [1, 1, 1], block: square, shared_bytes: 0 }, &[Arg::Null])
            .is_err());
        assert!(check
            .check("unbounded", LaunchShape { grid: [1, 65536, 1], block: tall, shared_bytes: 0 }, &[Arg::Null])
            .is_err());
        assert!(check
            .check("unbounded", LaunchShape { grid: [1, 1, 1], block: empty, shared_bytes: 0 }, &[Arg::Null])
            .is_err());
        let unknown = check.check("missing", LaunchShape::linear(1, 32), &[]).unwrap_err().to_string();
        assert!(unknown.contains("check-kernels.sh --update"), "{unknown}");
        assert!(check.check("emulation_primitives", LaunchShape::linear(1, 64), &[Arg::I32(1)]).is_ok());
    }

    #[test]
    fn the_committed_kernels_are_all_read() {
        let check = LaunchCheck::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/build")).unwrap();
        let entry = |name: &str| check.entries.get(name).unwrap_or_else(|| panic!("{name}: {check:?}"));
        assert_eq!(entry("w4a16_grouped").max_threads, 256);
        assert_eq!(entry("attention_causal").max_threads, 128);
        assert_eq!(entry("fp8_block_dequant_f32").max_threads, MAX_BLOCK_THREADS);
        assert_eq!(entry("silu_mul_f32").params, [".u64", ".u64", ".u64", ".u64"]);
        assert!(check.entries.len() >= 33, "{check:?}");
    }
}

//! The emulated device: kernels/*.cu compiled for the host with kernels/emulation/cuda_emulation.h into a small
//! server process (kernels/emulation/server.cpp) that holds "device" memory and runs launches block by block.
//! It runs the real launch code and kernels (the CUDA runtime backend, the quantize command's device path) on a machine
//! without a GPU (`--device emulated`, the device twins of the tests); it is slow (every CUDA thread is a fiber) and
//! meant for small models.
//!
//! The server is compiled on first use from the source tree this binary was built from (`kernels/` next to
//! Cargo.toml, or `$SQUEEZE_KERNELS_DIR`) with `$CXX` (default `g++`), and cached under `target/kernel-emulator/`
//! keyed by a hash of the sources.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::launch_check::LaunchCheck;
use super::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

struct Pipe {
    child: Child,
    input: BufWriter<ChildStdin>,
    output: BufReader<ChildStdout>,
}

struct Connection {
    pipe: Mutex<Pipe>,
    next_id: AtomicU64,
}

impl Connection {
    /// Sends one command and returns the reply's payload.
    fn call(&self, command: &[u8], payload: &[u8]) -> Result<Vec<u8>, CudaError> {
        let lost = |e: std::io::Error| CudaError::Driver {
            call: "emulated device",
            message: format!("the kernel emulator process stopped ({e}); a kernel crashed or ran out of memory"),
        };
        let mut pipe = self.pipe.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pipe.input.write_all(command).map_err(lost)?;
        pipe.input.write_all(payload).map_err(lost)?;
        pipe.input.flush().map_err(lost)?;
        let mut header = [0u8; 5];
        pipe.output.read_exact(&mut header).map_err(lost)?;
        let length = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut data = vec![0u8; length];
        pipe.output.read_exact(&mut data).map_err(lost)?;
        if header[0] != 0 {
            return Err(CudaError::Driver {
                call: "emulated device",
                message: String::from_utf8_lossy(&data).into_owned(),
            });
        }
        Ok(data)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let pipe = self.pipe.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = pipe.child.kill();
        let _ = pipe.child.wait();
    }
}

/// An allocation inside the emulator process; freed there when dropped.
struct Handle {
    id: u64,
    connection: Arc<Connection>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut command = vec![b'F'];
        command.extend(self.id.to_le_bytes());
        let _ = self.connection.call(&command, &[]);
    }
}

/// The emulated CUDA device.
pub struct Emulator {
    connection: Arc<Connection>,
    checks: Arc<LaunchCheck>,
}

fn handle_id(buffer: &DeviceBuffer) -> u64 {
    match buffer.handle.downcast_ref::<Handle>() {
        Some(handle) => handle.id,
        None => u64::MAX, // a buffer of another device: the server reports an unknown buffer
    }
}

/// The kernels/ folder to compile.
fn kernels_dir() -> PathBuf {
    std::env::var_os("SQUEEZE_KERNELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels"))
}

/// Hash of every source the server is built from (kernels/*.cu, *.cuh and emulation/*).
fn sources_hash(dir: &Path) -> Result<String, CudaError> {
    let missing = |e: std::io::Error| {
        CudaError::Module(format!(
            "the emulated device compiles the kernel sources in {} ({e}); run it from a squeeze source tree or set SQUEEZE_KERNELS_DIR",
            dir.display()
        ))
    };
    let mut files = Vec::new();
    for folder in [dir.to_path_buf(), dir.join("emulation")] {
        for entry in std::fs::read_dir(&folder).map_err(missing)? {
            let path = entry.map_err(missing)?.path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.file_name().map(|n| n.as_encoded_bytes().to_vec()).unwrap_or_default());
        hasher.update(std::fs::read(&file).map_err(missing)?);
    }
    Ok(hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The launch contracts of the compiled kernels next to the sources (kernels/build/), read once per process.
fn launch_checks() -> Result<Arc<LaunchCheck>, CudaError> {
    static CHECKS: Mutex<Option<Arc<LaunchCheck>>> = Mutex::new(None);
    let mut checks = CHECKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(checks) = checks.as_ref() {
        return Ok(checks.clone());
    }
    let read = Arc::new(LaunchCheck::from_dir(&kernels_dir().join("build"))?);
    *checks = Some(read.clone());
    Ok(read)
}

/// The compiled server for the current sources, building it when absent.
fn server_binary() -> Result<PathBuf, CudaError> {
    // One build at a time in this process: threads (parallel tests) share the pid-named partial file, and a
    // thread could start the binary while another's compiler still writes it ("text file busy").
    static BUILD: Mutex<()> = Mutex::new(());
    let _build = BUILD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = kernels_dir();
    let hash = sources_hash(&dir)?;
    let cache = std::env::var_os("SQUEEZE_EMULATOR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/kernel-emulator"));
    let binary = cache.join(format!("server-{hash}"));
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&cache)
        .map_err(|e| CudaError::Module(format!("cannot create {} for the kernel emulator: {e}", cache.display())))?;
    let partial = cache.join(format!("server-{hash}.{}.partial", std::process::id()));
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let output = Command::new(&compiler)
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE"])
        .args(["-DSQUEEZE_EMULATION", "-I"])
        .arg(&dir)
        .arg(dir.join("emulation/server.cpp"))
        .arg("-o")
        .arg(&partial)
        .output()
        .map_err(|e| {
            CudaError::Module(format!(
                "running the host C++ compiler `{compiler}` failed ({e}); install g++ or set CXX"
            ))
        })?;
    if !output.status.success() {
        return Err(CudaError::Module(format!(
            "compiling the kernel emulator failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::rename(&partial, &binary)
        .map_err(|e| CudaError::Module(format!("cannot place the kernel emulator at {}: {e}", binary.display())))?;
    Ok(binary)
}

impl Emulator {
    /// Builds (or reuses) the emulator and starts its process.
    pub fn start() -> Result<Emulator, CudaError> {
        let binary = server_binary()?;
        let checks = launch_checks()?;
        let mut child = Command::new(&binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| CudaError::Module(format!("starting the kernel emulator {}: {e}", binary.display())))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(CudaError::Module("the kernel emulator has no pipes".into()));
        };
        let pipe = Pipe { child, input: BufWriter::new(input), output: BufReader::new(output) };
        let connection = Arc::new(Connection { pipe: Mutex::new(pipe), next_id: AtomicU64::new(1) });
        Ok(Emulator { connection, checks })
    }
}

impl Device for Emulator {
    fn describe(&self) -> String {
        "emulated (kernels/*.cu on the host)".into()
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let id = self.connection.next_id.fetch_add(1, Ordering::Relaxed);
        let mut command = vec![b'A'];
        command.extend(id.to_le_bytes());
        command.extend((bytes as u64).to_le_bytes());
        self.connection.call(&command, &[])?;
        Ok(DeviceBuffer::new(bytes, Box::new(Handle { id, connection: self.connection.clone() })))
    }

    fn write(&self, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        let mut command = vec![b'W'];
        command.extend(handle_id(buffer).to_le_bytes());
        command.extend(0u64.to_le_bytes());
        command.extend((bytes.len() as u64).to_le_bytes());
        self.connection.call(&command, bytes).map(|_| ())
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        let mut command = vec![b'R'];
        command.extend(handle_id(buffer).to_le_bytes());
        command.extend(0u64.to_le_bytes());
        command.extend((out.len() as u64).to_le_bytes());
        let data = self.connection.call(&command, &[])?;
        out.copy_from_slice(&data);
        Ok(())
    }

    fn copy(&self, source: &DeviceBuffer, target: &DeviceBuffer, offset: usize) -> Result<(), CudaError> {
        let mut command = vec![b'C'];
        command.extend(handle_id(source).to_le_bytes());
        command.extend(handle_id(target).to_le_bytes());
        command.extend((offset as u64).to_le_bytes());
        command.extend((source.bytes() as u64).to_le_bytes());
        self.connection.call(&command, &[]).map(|_| ())
    }

    fn launch(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError> {
        self.checks.check(kernel, shape, args)?;
        let mut command = vec![b'L'];
        command.extend((kernel.len() as u32).to_le_bytes());
        command.extend(kernel.as_bytes());
        for value in shape.grid.iter().chain(&shape.block).chain([&shape.shared_bytes]) {
            command.extend(value.to_le_bytes());
        }
        command.extend((args.len() as u32).to_le_bytes());
        for arg in args {
            match *arg {
                Arg::Null => command.push(0),
                Arg::Buffer(buffer) | Arg::At(buffer, _) => {
                    let offset = if let Arg::At(_, offset) = *arg { offset } else { 0 };
                    command.push(1);
                    command.extend(handle_id(buffer).to_le_bytes());
                    command.extend((offset as u64).to_le_bytes());
                }
                Arg::I32(value) => push_integer(&mut command, value as i64),
                Arg::I64(value) => push_integer(&mut command, value),
                Arg::U32(value) => push_integer(&mut command, value as i64),
                Arg::F32(value) => {
                    command.push(3);
                    command.extend((value as f64).to_le_bytes());
                }
                Arg::F64(value) => {
                    command.push(3);
                    command.extend(value.to_le_bytes());
                }
            }
        }
        self.connection.call(&command, &[]).map(|_| ())
    }
}

fn push_integer(command: &mut Vec<u8>, value: i64) {
    command.push(2);
    command.extend(value.to_le_bytes());
}

//! The `squeeze` binary: everything lives in the library; this maps the result to an exit code.

fn main() {
    std::process::exit(squeeze::cli::run());
}

//! The `loci` binary: everything is in the library (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    loci_cli::main()
}

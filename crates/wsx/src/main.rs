//! The `wsx` binary (see the library's documentation).

fn main() -> std::process::ExitCode {
    wsx::main()
}

fn main() -> std::process::ExitCode {
    hostmesh::cli::main()
}

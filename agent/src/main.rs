use clap::Parser;

fn main() -> std::process::ExitCode {
    mlnode_agent::cli::run(mlnode_agent::cli::Cli::parse())
}

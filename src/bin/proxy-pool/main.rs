//! `proxy-pool`: run the Distribution function locally and operate the pool.
//!
//! One file per command group: [`cli`] (every command and its arguments,
//! what a command returns, the pool it works on),
//! [`serve`], [`load`] (`load`, `load-demo`), [`stats`] (`stats`, `prune`;
//! the counting in [`inventory`]),
//! [`contract`] (`health`, `claim`, `drain`, `ack`, `release`, `remove`,
//! `functions`),
//! [`credentials`] (`hash-credential`), [`clients`] (`clients
//! add|rotate|revoke|list|import`), [`aggregates`] (`aggregates flush`,
//! `usage`) and [`bench`]. Their standard output goes through [`output`],
//! so a reader that goes away ends a command quietly with status 0; the
//! lines of standard input they skip are counted in [`skipped`].

mod aggregates;
mod bench;
mod cli;
mod clients;
mod contract;
mod credentials;
mod inventory;
mod load;
mod output;
mod serve;
mod skipped;
mod stats;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Bench(_)) {
        proxy_pool::telemetry::init_discarding();
    } else {
        proxy_pool::telemetry::init(false);
    }
    let result = match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Stats(args) => stats::stats(args).await,
        Command::Prune(args) => stats::prune(args).await,
        Command::Health(args) => contract::health(args).await,
        Command::Claim(args) => contract::claim(args).await,
        Command::Drain(args) => contract::drain(args).await,
        Command::Ack(args) => contract::ack(args).await,
        Command::Release(args) => contract::release(args).await,
        Command::Remove(args) => contract::remove(args).await,
        Command::Functions(args) => contract::functions(args).await,
        Command::HashCredential(args) => credentials::hash(args),
        Command::Clients(command) => clients::run(command).await,
        Command::Load(args) => load::load(args).await,
        Command::LoadDemo(args) => load::load_demo(args).await,
        Command::Aggregates(cli::AggregatesCommand::Flush(args)) => aggregates::flush(args).await,
        Command::Usage(args) => aggregates::usage(args).await,
        Command::Bench(args) => bench::command(*args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<output::OutputClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proxy-pool: {e}");
            ExitCode::FAILURE
        }
    }
}

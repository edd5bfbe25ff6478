//! The kubesim binary for scripts, the demo and benchmarks: serves until Ctrl-C and prints
//! exactly one line on stdout once listening (`kubesim ready ADDR N clusters`).

use clap::Parser;
use std::io::Write;

fn main() -> anyhow::Result<()> {
    kubesim::run_until_interrupted(kubesim::Options::parse(), |ready| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready.line())?;
        out.flush()?;
        Ok(())
    })
}

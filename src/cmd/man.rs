//! `rdeploy man`: the manual page (roff).

use crate::exit::Code;
use crate::out::Out;

pub fn run(cli: clap::Command, out: &Out) -> anyhow::Result<Code> {
    let mut text = Vec::new();
    clap_mangen::Man::new(cli).render(&mut text)?;
    out!(out, "{}", String::from_utf8_lossy(&text));
    Ok(Code::Ok)
}

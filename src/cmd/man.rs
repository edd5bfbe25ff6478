//! `rdeploy man`: the manual page (roff).

use crate::exit::Code;

pub fn run(cli: clap::Command) -> anyhow::Result<Code> {
    let mut text = Vec::new();
    clap_mangen::Man::new(cli).render(&mut text)?;
    out!("{}", String::from_utf8_lossy(&text));
    Ok(Code::Ok)
}

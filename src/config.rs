//! Gateway settings. Only the listen address exists until the receiver lands; the TOML file and
//! `WSR_*` overrides of DESIGN §8 arrive with it.

use std::net::{Ipv4Addr, SocketAddr};

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
        }
    }
}

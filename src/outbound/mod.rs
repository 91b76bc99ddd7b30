//! The sending side of the gateway: our own reliable messages to partners (`sender`), the
//! callback acknowledgments we owe to partners who chose the Callback reply pattern (D10),
//! which URLs applications may send to (`destination`, D15), the one HTTP client setup
//! every outbound call uses (`http_client`: no redirects, capped answers), and how each
//! partner is reached (`partner_clients`: its TLS, our credentials, its poll address).

pub mod backend;
pub mod callbacks;
pub mod destination;
pub mod http_client;
pub mod operator;
pub mod partner_clients;
pub mod partner_report;
pub mod sender;
pub mod submit;
pub mod view;
